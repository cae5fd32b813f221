#include "moetron/nn/transformer.h"

#include <algorithm>
#include <chrono>

#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/norm.h"
#include "moetron/nn/media_fusion.h"
#include "moetron/nn/tensor_parallel_2d.h"
#include "moetron/nn/vocab_parallel_ce.h"

namespace moetron::nn {

void LossStats::add_tasks(const LossStats& o) {
  if (task_ce_sum.size() < o.task_ce_sum.size()) {
    task_ce_sum.resize(o.task_ce_sum.size(), 0.0);
    task_tokens.resize(o.task_tokens.size(), 0);
  }
  for (size_t i = 0; i < o.task_ce_sum.size(); ++i) {
    task_ce_sum[i] += o.task_ce_sum[i];
    task_tokens[i] += o.task_tokens[i];
  }
  if (task_grad_sq.size() < o.task_grad_sq.size()) task_grad_sq.resize(o.task_grad_sq.size(), 0.0);
  for (size_t i = 0; i < o.task_grad_sq.size(); ++i) task_grad_sq[i] += o.task_grad_sq[i];
}

Transformer::Transformer(const ModelConfig& model, const MoeConfig& moe, Precision prec,
                         ExpertParallel ep, TensorParallel tp, PipelinePlace place)
    : model_(model), moe_(moe), prec_(prec), tp_(tp) {
  if (place.chunks.empty()) place.chunks = {{0, model.n_layers}};
  const auto std = static_cast<float>(model.init_std);
  MOETRON_CHECK(tp_.size >= 1 && tp_.rank >= 0 && tp_.rank < tp_.size, "tensor-parallel rank ",
                tp_.rank, " of ", tp_.size);
  MOETRON_CHECK(model.vocab_size % tp_.size == 0, "model.vocab_size = ", model.vocab_size,
                " does not divide over parallel.tp = ", tp_.size,
                " (the vocab-parallel embedding and head)");
  MOETRON_CHECK(!tp_.on() || prec.accum == DType::f32,
                "tensor parallelism needs fp32 statistics (accum f32)");
  MOETRON_CHECK(
      !prec.bf16_matrix_grads || prec.compute == DType::bf16,
      "bf16 matrix gradients (train.grad_dtype = bf16) need bf16 compute (train.precision = bf16)");
  tp_.group = nullptr;
  tp_.kv_group = nullptr;
  tp_.columns = nullptr;
  MOETRON_CHECK(!tp_.grid() || (tp_.on() && tp_.sequence_parallel),
                "2-D tensor parallelism needs a grid of at least 2 x 2 with sequence parallelism "
                "in its rows");
  const int64_t v_local = model.vocab_size / tp_.size;
  const auto add_vocab = [&](const char* name) {
    Parameter& p = params_.add(name, {v_local, model.d_model}, prec.compute, prec.accum,
                               ParallelKind::vocab, InitKind::normal, std, false);
    if (tp_.on())
      ParameterSet::set_shard(p, {model.vocab_size, model.d_model}, tp_.rank * v_local, 0);
    if (tp_.on()) split_over_grid_column(tp_, p);
    return &p;
  };
  MOETRON_CHECK(!model.tie_embeddings || (place.embedding && place.head),
                "tied embeddings need the embedding and the head on one pipeline stage");
  embed_ = place.embedding ? add_vocab("model.embed_tokens.weight") : nullptr;
  int64_t previous_end = 0;
  for (const auto& [first, end] : place.chunks) {
    MOETRON_CHECK(first >= previous_end && first < end && end <= model.n_layers,
                  "pipeline chunk of layers [", first, ", ", end,
                  ") out of order or outside the model's ", model.n_layers);
    previous_end = end;
    const size_t chunk_begin = blocks_.size();
    for (int64_t i = first; i < end; ++i) {
      const size_t begin = params_.all().size();
      blocks_.push_back(std::make_unique<Block>(model, moe, i, prec, params_, ep, &tp_));
      block_params_.emplace_back(begin, params_.all().size());
      cross_params_.emplace_back(0, 0);
    }
    chunks_.emplace_back(chunk_begin, blocks_.size());
  }
  final_norm_ = nullptr;
  head_ = nullptr;
  if (place.head) {
    final_norm_ = &params_.add("model.norm.weight", {model.d_model}, prec.accum, prec.accum,
                               ParallelKind::replicated, InitKind::ones, 0, false);
    final_norm_->grad_partial_over_tp = tp_.sequence_parallel;
    head_ = model.tie_embeddings ? embed_ : add_vocab("lm_head.weight");
  }
}

Transformer::~Transformer() = default;

void Transformer::enable_media(const MultimodalModelConfig& cfg) {
  MOETRON_CHECK(!media_, "the encoders are already built");
  MOETRON_CHECK(!tp_.grid(),
                "multimodal models with 2-D tensor parallelism (parallel.tp_2d) are not "
                "supported yet");
  MOETRON_CHECK(!cp_.on(),
                "multimodal prefixes with context parallelism (parallel.cp > 1) are "
                "not supported yet");
  MOETRON_CHECK(seq_chunk_ == 0, "multimodal prefixes with train.seq_chunk are not supported yet");
  if (cfg.cross_attention()) {
    MOETRON_CHECK(cfg.cross_attention_every >= 1,
                  "multimodal.cross_attention_every must be >= 1, got ", cfg.cross_attention_every);
    // The layers read the encoders' tokens, which live with the embedding.
    MOETRON_CHECK(embed_ && head_ && chunks_.size() == 1,
                  "gated cross-attention layers (multimodal.fusion = \"", cfg.fusion,
                  "\") with pipeline parallelism are not supported yet");
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (!cfg.cross_attention_at(blocks_[i]->index())) continue;
      const size_t begin = params_.all().size();
      blocks_[i]->add_cross_attention(model_, params_);
      cross_params_[i] = {begin, params_.all().size()};
    }
  }
  if (!embed_) return;  // the encoders live with the embedding (the first pipeline stage)
  media_ = std::make_unique<MediaFusion>(cfg, model_.d_model, prec_, params_, &tp_);
}

MediaTokens Transformer::fuse_media(kernels::Context& ctx, const MultimodalBatch* mm, int64_t seq,
                                    const Tensor& x) {
  if (!mm || mm->media.empty()) return {};
  MOETRON_CHECK(media_,
                "a multimodal batch for a model built without encoders (multimodal.enabled)");
  for (Parameter* p : media_->parameters()) need(p);
  return media_->forward(ctx, *mm, seq, x);
}

void Transformer::fuse_media_backward(kernels::Context& ctx, const MultimodalBatch* mm, int64_t seq,
                                      const Tensor& d_x, const Tensor& d_media) {
  if (!mm || mm->media.empty()) return;
  media_->backward(ctx, *mm, seq, d_x, d_media);
}

Tensor Transformer::media_grad(const MediaTokens& media) const {
  return media.tokens.defined() ? Tensor::zeros(media.tokens.shape(), media.tokens.dtype())
                                : Tensor();
}

void Transformer::need_block(size_t i) {
  need(block_params_[i].first, block_params_[i].second);
  need(cross_params_[i].first, cross_params_[i].second);
}

void Transformer::block_grads_ready(size_t i) {
  grads_ready(block_params_[i].first, block_params_[i].second);
  grads_ready(cross_params_[i].first, cross_params_[i].second);
}

void Transformer::route_by_modality(const MultimodalBatch* mm) {
  Tensor modality;  // undefined: every token is text
  if (mm && mm->token_modality.defined()) {
    modality = mm->token_modality;
    // Under tensor parallelism the MoE layers see this rank's token slice.
    if (tp_.on()) {
      const int64_t rows = tp_.slice_rows(modality.numel());
      modality = modality.slice(tp_.rank * rows, (tp_.rank + 1) * rows);
    }
  }
  for (MoeLayer* l : moe_layers()) l->set_token_modality(modality);
}

void Transformer::media_grads_ready() {
  // Every step, media or not: the reducers wait for every parameter.
  if (!media_) return;
  for (Parameter* p : media_->parameters()) grad_ready(p);
}

void Transformer::set_tensor_group(comm::Communicator* group) {
  if (!tp_.on()) return;
  if (tp_.grid()) {
    const int64_t cols = tp_.size, rank = tp_.grid_row * cols + tp_.rank;
    MOETRON_CHECK(group && group->size() == tp_.grid_rows * cols && group->rank() == rank,
                  "built for grid rank ", rank, " of ", tp_.grid_rows, " x ", cols,
                  " but given rank ", group ? group->rank() : -1, " of ",
                  group ? group->size() : 0);
    grid_row_group_ = group->split(static_cast<int>(tp_.grid_row), static_cast<int>(tp_.rank));
    grid_column_group_ = group->split(static_cast<int>(tp_.rank), static_cast<int>(tp_.grid_row));
    tp_.columns = grid_column_group_.get();
    grid_tp_ = TensorParallel{tp_.grid_rows * cols, rank, true, group, nullptr};
    group = grid_row_group_.get();
  }
  MOETRON_CHECK(group && group->size() == tp_.size && group->rank() == tp_.rank,
                "built for tensor-parallel rank ", tp_.rank, " of ", tp_.size, " but given rank ",
                group ? group->rank() : -1, " of ", group ? group->size() : 0);
  tp_.group = group;
  if (tp_.size > model_.n_kv_heads) {
    // Ranks whose query heads share one kv head (attention.h).
    const int64_t share = tp_.size / model_.n_kv_heads;
    kv_group_ = group->split(static_cast<int>(tp_.rank / share), static_cast<int>(tp_.rank));
    tp_.kv_group = kv_group_.get();
  }
}

void Transformer::set_context_group(comm::Communicator* group, bool all_to_all) {
  MOETRON_CHECK(group && group->size() >= 1, "context parallelism without its cp group");
  MOETRON_CHECK(seq_chunk_ == 0, "parallel.cp > 1 with train.seq_chunk: pick one");
  MOETRON_CHECK(!media_,
                "multimodal prefixes with context parallelism (parallel.cp > 1) are not "
                "supported yet");
  cp_.group = group;
  cp_.size = group->size();
  cp_.rank = group->rank();
  cp_.all_to_all = all_to_all;
  if (all_to_all) {
    const int64_t heads = model_.n_heads / tp_.size;
    const int64_t kv_heads = std::max<int64_t>(model_.n_kv_heads / tp_.size, 1);
    MOETRON_CHECK(heads % cp_.size == 0 && kv_heads % cp_.size == 0,
                  "parallel.cp_comm = \"all_to_all\" splits each rank's ", heads, " query and ",
                  kv_heads, " kv heads over parallel.cp = ", cp_.size, ": both must divide");
  }
  for (auto& blk : blocks_) blk->attention().set_context_parallel(&cp_);
}

Transformer::ContextSlice Transformer::context_slice(const Tensor& ids, const Tensor& targets) {
  MOETRON_CHECK(ids.rank() == 2 && ids.dtype() == DType::i32, "inputs must be i32 [B, S], got ",
                ids.str());
  check_shape(targets, "targets", ids.shape());
  const int64_t b = ids.dim(0), s = ids.dim(1);
  MOETRON_CHECK(s <= model_.max_seq_len, "sequence of ", s,
                " tokens exceeds model.max_seq_len = ", model_.max_seq_len);
  check_context_split(cp_, s);
  cp_.seq = s;
  cp_.documents = document_separator_ >= 0;
  ContextSlice out;
  out.batch = b;
  out.seq = cp_.local_seq();
  out.ids = context_local_rows(cp_, ids, b);
  out.targets = context_local_rows(cp_, targets, b);
  out.positions = context_local_rows(cp_, positions_of(ids, b, s), b).reshape({b * out.seq});
  return out;
}

void Transformer::grad_ready(Parameter* p) {
  if (on_grad_ready) on_grad_ready(*p);
}

void Transformer::need(Parameter* p) {
  if (before_use && p) before_use(*p);
}

void Transformer::need(size_t begin, size_t end) {
  if (!before_use) return;
  for (size_t i = begin; i < end; ++i) before_use(*params_.all()[i]);
}

void Transformer::grads_ready(size_t begin, size_t end) {
  if (!on_grad_ready) return;
  for (size_t i = begin; i < end; ++i) on_grad_ready(*params_.all()[i]);
}

void Transformer::set_expert_group(comm::Communicator* group) {
  for (MoeLayer* l : moe_layers()) l->set_expert_group(group);
}

std::vector<MoeLayer*> Transformer::moe_layers() {
  std::vector<MoeLayer*> v;
  for (auto& b : blocks_) {
    if (b->moe()) v.push_back(b->moe());
  }
  return v;
}

Tensor Transformer::positions_of(const Tensor& ids, int64_t batch, int64_t seq) const {
  Tensor positions = Tensor::empty({batch * seq}, DType::i32);
  int32_t* pos = positions.data<int32_t>();
  if (document_separator_ < 0) {
    for (int64_t i = 0; i < batch * seq; ++i) pos[i] = static_cast<int32_t>(i % seq);
    return positions;
  }
  MOETRON_CHECK(ids.defined() && ids.numel() == batch * seq,
                "packed documents need the micro-batch's token ids on every pipeline stage");
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < batch * seq; ++i) {
    const bool starts = i % seq == 0 || id[i - 1] == document_separator_;
    pos[i] = starts ? 0 : pos[i - 1] + 1;
  }
  return positions;
}

Tensor Transformer::embed(kernels::Context& ctx, const Tensor& ids) {
  need(embed_);
  GridGather grid(tp_);
  grid.gather({grid_slot(*embed_)}, true, false);
  Tensor x = Tensor::empty({ids.numel(), model_.d_model}, prec_.compute);
  // Vocab-parallel: rows of other shards come out zero; the sum over tp is the embedding.
  kernels::embedding_forward(ctx, ids, embed_->value, x, vocab_row0(*embed_));
  return finish_row_parallel(tp_, x);
}

void Transformer::embed_backward(kernels::Context& ctx, const Tensor& ids, const Tensor& d_x) {
  // Under a 2-D grid into a gathered gradient, summed back over the column.
  GridGather grid(tp_);
  grid.gather({grid_slot(*embed_)}, false, true);
  kernels::embedding_backward(ctx, ids, d_x, embed_->grad, vocab_row0(*embed_));
  grid.finish(ctx);
}

int64_t Transformer::vocab_row0(const Parameter& p) const {
  // A grid-split block is used gathered: the grid row's whole vocabulary shard.
  return tp_.grid() ? tp_.rank * (model_.vocab_size / tp_.size) : p.shard.row0;
}

Tensor Transformer::hidden_states(kernels::Context& ctx, const Tensor& inputs, double loss_weight,
                                  LossStats& stats, const Tensor& positions) {
  MOETRON_CHECK(inputs.rank() == 2 && inputs.dtype() == DType::i32,
                "inputs must be i32 [B, S], got ", inputs.str());
  MOETRON_CHECK(
      embed_ && head_ && chunks_.size() == 1,
      "this rank holds one pipeline stage: run it through chunk_forward / chunk_backward");
  const int64_t b = inputs.dim(0), s = inputs.dim(1), t = b * s;
  MOETRON_CHECK(s <= model_.max_seq_len, "sequence of ", s,
                " tokens exceeds model.max_seq_len = ", model_.max_seq_len);
  Saved sv;
  sv.ids = inputs.reshape({t});
  sv.positions = positions.defined() ? positions : positions_of(sv.ids, b, s);
  Tensor x = embed(ctx, sv.ids);
  sv.media = fuse_media(ctx, multimodal_.get(), s, x);
  route_by_modality(multimodal_.get());
  MoeStats ms;
  // backward_blocks reads saved_.positions and saved_.media.
  x = forward_blocks(ctx, x, sv.positions, b, s, loss_weight, ms, &sv.media);
  stats.aux_loss += ms.aux_loss + ms.entropy_loss;
  stats.z_loss += ms.z_loss;
  stats.dropped += ms.dropped;
  sv.x_final = x;
  const int64_t rows = x.dim(0);  // t / tp under sequence parallelism
  sv.rstd = Tensor::empty({rows}, prec_.accum);
  need(final_norm_);
  Tensor h = Tensor::empty({rows, model_.d_model}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, final_norm_->value, static_cast<float>(model_.norm_eps), h,
                           sv.rstd);
  saved_ = std::move(sv);
  return h;
}

Tensor Transformer::head_loss(kernels::Context& ctx, const Tensor& h_given, const Tensor& targets,
                              double grad_scale, bool backward, LossStats& stats,
                              const MultimodalBatch* mm) {
  need(head_);
  GridGather grid(tp_);
  grid.gather({grid_slot(*head_)}, true, backward);
  const Tensor h = column_parallel_input(tp_, h_given);
  const int64_t t = h.dim(0);
  const Tensor tgt = targets.reshape({t});
  Tensor losses = Tensor::empty({t}, prec_.accum);
  Tensor d_h = backward ? Tensor::empty({t, model_.d_model}, prec_.compute) : Tensor();
  // One cross-entropy call per run of rows with one gradient scale (a
  // multimodal batch's tasks), else one for every row.
  const std::vector<TaskRun> runs = task_runs(mm, t, grad_scale);
  for (const TaskRun& r : runs) {
    const Tensor hr = h.slice(r.begin, r.end), tr = tgt.slice(r.begin, r.end);
    const Tensor lr = losses.slice(r.begin, r.end);
    const Tensor dr = backward ? d_h.slice(r.begin, r.end) : Tensor();
    const auto scale = static_cast<float>(r.grad_scale);
    if (tp_.on()) {
      vocab_parallel_cross_entropy(ctx, tp_, hr, head_->value, tr, scale, ce_chunk_tokens, lr, dr,
                                   backward ? head_->grad : Tensor());
    } else {
      kernels::cross_entropy_fused(ctx, hr, head_->value, tr, scale, ce_chunk_tokens, lr, dr,
                                   backward ? head_->grad : Tensor());
    }
  }
  if (backward && tp_.on()) d_h = finish_row_parallel(tp_, d_h);
  grid.finish(ctx);
  count_losses(mm, tgt, losses, runs, stats);
  if (backward && mm && !mm->row_task.empty()) add_task_grad_sq(ctx, d_h, t, runs, stats);
  return d_h;
}

void Transformer::add_task_grad_sq(kernels::Context& ctx, const Tensor& d_h, int64_t rows,
                                   const std::vector<TaskRun>& runs, LossStats& stats) const {
  // d_h holds rows [row0, row0 + held) of the head's `rows`.
  const int64_t held = d_h.dim(0), row0 = held < rows ? tp_.rank * held : 0;
  stats.task_grad_sq.resize(stats.task_ce_sum.size(), 0.0);
  for (const TaskRun& r : runs) {
    const int64_t begin = std::max(r.begin, row0), end = std::min(r.end, row0 + held);
    if (begin >= end) continue;
    stats.task_grad_sq[static_cast<size_t>(r.task)] +=
        kernels::sum_squares(ctx, d_h.slice(begin - row0, end - row0));
  }
}

std::vector<Transformer::TaskRun> Transformer::task_runs(const MultimodalBatch* mm, int64_t rows,
                                                         double grad_scale) {
  if (!mm || mm->row_task.empty()) return {TaskRun{0, rows, grad_scale, -1}};
  const auto b = static_cast<int64_t>(mm->row_task.size());
  MOETRON_CHECK(rows % b == 0, "a multimodal batch of ", b, " rows but ", rows, " head rows");
  const int64_t per_row = rows / b;
  std::vector<TaskRun> runs;
  for (int64_t i = 0; i < b; ++i) {
    const int32_t task = mm->row_task[static_cast<size_t>(i)];
    MOETRON_CHECK(task >= 0 && task < mm->num_tasks(), "row ", i, " has task ", task, " of ",
                  mm->num_tasks());
    if (!runs.empty() && runs.back().task == task) {
      runs.back().end += per_row;
      continue;
    }
    runs.push_back(
        {i * per_row, (i + 1) * per_row, mm->task_grad_scale[static_cast<size_t>(task)], task});
  }
  return runs;
}

void Transformer::count_losses(const MultimodalBatch* mm, const Tensor& tgt, const Tensor& losses,
                               const std::vector<TaskRun>& runs, LossStats& stats) const {
  const int32_t* tp = tgt.data<int32_t>();
  if (mm && !mm->row_task.empty()) {
    stats.task_ce_sum.resize(static_cast<size_t>(mm->num_tasks()), 0.0);
    stats.task_tokens.resize(static_cast<size_t>(mm->num_tasks()), 0);
  }
  for (const TaskRun& r : runs) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      if (tp[i] < 0) continue;
      const double ce =
          prec_.accum == DType::f64 ? losses.data<double>()[i] : losses.data<float>()[i];
      ++stats.tokens;
      stats.ce_sum += ce;
      if (r.task < 0) continue;
      stats.task_ce_sum[static_cast<size_t>(r.task)] += ce;
      ++stats.task_tokens[static_cast<size_t>(r.task)];
    }
  }
}

LossStats Transformer::forward_backward(kernels::Context& ctx, const Tensor& inputs,
                                        const Tensor& targets, double grad_scale,
                                        double loss_weight, bool backward) {
  check_shape(targets, "targets", inputs.shape());
  if (seq_chunk_ > 0 && inputs.rank() == 2 && seq_chunk_ < inputs.dim(1))
    return forward_backward_chunked(ctx, inputs, targets, grad_scale, loss_weight, backward);
  LossStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  for (MoeLayer* l : moe_layers()) l->set_balance_group(backward ? balance_group_ : nullptr);
  // A 2-D grid's rows split the micro-batch's rows (nn/tensor_parallel_2d.h).
  ContextSlice local{grid_row_slice(tp_, inputs), grid_row_slice(tp_, targets), Tensor()};
  if (cp_.on()) local = context_slice(local.ids, local.targets);
  const Tensor h = hidden_states(ctx, local.ids, loss_weight, stats, local.positions);
  Tensor d_h = head_loss(ctx, h, local.targets, grad_scale, backward, stats, multimodal_.get());
  const auto t1 = std::chrono::steady_clock::now();
  stats.forward_s = std::chrono::duration<double>(t1 - t0).count();
  if (!backward) {
    for (auto& blk : blocks_) blk->release();
    release_checkpoints();
    saved_ = Saved{};
    return stats;
  }
  Tensor d_x = Tensor::empty({d_h.dim(0), model_.d_model}, prec_.compute);
  kernels::rmsnorm_backward(ctx, d_h, saved_.x_final, final_norm_->value, saved_.rstd, d_x,
                            final_norm_->grad);
  d_h = Tensor();
  saved_.x_final = Tensor();
  grad_ready(final_norm_);
  if (head_ != embed_) grad_ready(head_);
  const Tensor d_media = media_grad(saved_.media);
  d_x = column_parallel_input(tp_, backward_blocks(ctx, std::move(d_x), d_media));
  fuse_media_backward(ctx, multimodal_.get(), inputs.dim(1), d_x, d_media);
  embed_backward(ctx, saved_.ids, d_x);
  grad_ready(embed_);
  media_grads_ready();
  saved_ = Saved{};
  stats.backward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return stats;
}

Tensor Transformer::last_logits(kernels::Context& ctx, const Tensor& inputs, int64_t positions) {
  MOETRON_CHECK(!tp_.on() && !cp_.on(),
                "sampling runs on one rank (a tensor- or context-parallel model's checkpoint loads "
                "there)");
  MOETRON_CHECK(inputs.rank() == 2 && inputs.dtype() == DType::i32,
                "inputs must be i32 [B, S], got ", inputs.str());
  MOETRON_CHECK(positions >= 1 && positions <= inputs.dim(1), "cannot take the logits of the last ",
                positions, " positions of rows of ", inputs.dim(1));
  LossStats unused;
  for (MoeLayer* l : moe_layers()) l->set_balance_group(nullptr);
  const Tensor h = hidden_states(ctx, inputs, 0.0, unused);
  for (auto& blk : blocks_) blk->release();
  release_checkpoints();
  saved_ = Saved{};
  const int64_t b = inputs.dim(0), s = inputs.dim(1), n = positions;
  Tensor last = Tensor::empty({b * n, model_.d_model}, prec_.compute);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < n; ++j) last[i * n + j].copy_from(h[i * s + s - n + j]);
  }
  need(head_);
  Tensor logits = Tensor::empty({b * n, model_.vocab_size}, prec_.accum);
  kernels::MatmulArgs args;
  args.trans_b = true;
  kernels::matmul(ctx, last, head_->value, logits, args);
  return logits;
}

}  // namespace moetron::nn
