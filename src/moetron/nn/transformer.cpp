#include "moetron/nn/transformer.h"

#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/norm.h"

namespace moetron::nn {

Transformer::Transformer(const ModelConfig& model, const MoeConfig& moe, Precision prec, ExpertParallel ep)
    : model_(model), moe_(moe), prec_(prec) {
  const auto std = static_cast<float>(model.init_std);
  embed_ = &params_.add("model.embed_tokens.weight", {model.vocab_size, model.d_model}, prec.compute,
                        prec.accum, ParallelKind::vocab, InitKind::normal, std, false);
  for (int64_t i = 0; i < model.n_layers; ++i) {
    const size_t begin = params_.all().size();
    blocks_.push_back(std::make_unique<Block>(model, moe, i, prec, params_, ep));
    block_params_.emplace_back(begin, params_.all().size());
  }
  final_norm_ = &params_.add("model.norm.weight", {model.d_model}, prec.accum, prec.accum,
                             ParallelKind::replicated, InitKind::ones, 0, false);
  head_ = model.tie_embeddings
              ? embed_
              : &params_.add("lm_head.weight", {model.vocab_size, model.d_model}, prec.compute,
                             prec.accum, ParallelKind::vocab, InitKind::normal, std, false);
}

void Transformer::grad_ready(Parameter* p) {
  if (on_grad_ready) on_grad_ready(*p);
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

Tensor Transformer::hidden_states(kernels::Context& ctx, const Tensor& inputs, double loss_weight,
                                  LossStats& stats) {
  MOETRON_CHECK(inputs.rank() == 2 && inputs.dtype() == DType::i32, "inputs must be i32 [B, S], got ",
                inputs.str());
  const int64_t b = inputs.dim(0), s = inputs.dim(1), t = b * s;
  MOETRON_CHECK(s <= model_.max_seq_len, "sequence of ", s, " tokens exceeds model.max_seq_len = ",
                model_.max_seq_len);
  Saved sv;
  sv.ids = inputs.reshape({t});
  sv.positions = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) sv.positions.data<int32_t>()[i] = static_cast<int32_t>(i % s);
  Tensor x = Tensor::empty({t, model_.d_model}, prec_.compute);
  kernels::embedding_forward(ctx, sv.ids, embed_->value, x, 0);
  MoeStats ms;
  x = forward_blocks(ctx, x, sv.positions, b, s, loss_weight, ms);
  stats.aux_loss += ms.aux_loss;
  stats.z_loss += ms.z_loss;
  stats.dropped += ms.dropped;
  sv.x_final = x;
  sv.rstd = Tensor::empty({t}, prec_.accum);
  Tensor h = Tensor::empty({t, model_.d_model}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, final_norm_->value, static_cast<float>(model_.norm_eps), h, sv.rstd);
  saved_ = std::move(sv);
  return h;
}

LossStats Transformer::forward_backward(kernels::Context& ctx, const Tensor& inputs,
                                        const Tensor& targets, double grad_scale,
                                        double loss_weight, bool backward) {
  check_shape(targets, "targets", inputs.shape());
  LossStats stats;
  for (MoeLayer* l : moe_layers()) l->set_balance_group(backward ? balance_group_ : nullptr);
  const Tensor h = hidden_states(ctx, inputs, loss_weight, stats);
  const int64_t t = h.dim(0);
  const Tensor tgt = targets.reshape({t});
  Tensor losses = Tensor::empty({t}, prec_.accum);
  Tensor d_h = backward ? Tensor::empty({t, model_.d_model}, prec_.compute) : Tensor();
  kernels::cross_entropy_fused(ctx, h, head_->value, tgt, static_cast<float>(grad_scale),
                               ce_chunk_tokens, losses, d_h, backward ? head_->grad : Tensor());
  const int32_t* tp = tgt.data<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    if (tp[i] < 0) continue;
    ++stats.tokens;
    stats.ce_sum += prec_.accum == DType::f64 ? losses.data<double>()[i] : losses.data<float>()[i];
  }
  if (!backward) {
    for (auto& blk : blocks_) blk->release();
    release_checkpoints();
    saved_ = Saved{};
    return stats;
  }
  Tensor d_x = Tensor::empty({t, model_.d_model}, prec_.compute);
  kernels::rmsnorm_backward(ctx, d_h, saved_.x_final, final_norm_->value, saved_.rstd, d_x,
                            final_norm_->grad);
  d_h = Tensor();
  saved_.x_final = Tensor();
  grad_ready(final_norm_);
  if (head_ != embed_) grad_ready(head_);
  d_x = backward_blocks(ctx, std::move(d_x));
  kernels::embedding_backward(ctx, saved_.ids, d_x, embed_->grad, 0);
  grad_ready(embed_);
  saved_ = Saved{};
  return stats;
}

Tensor Transformer::last_logits(kernels::Context& ctx, const Tensor& inputs) {
  LossStats unused;
  for (MoeLayer* l : moe_layers()) l->set_balance_group(nullptr);
  const Tensor h = hidden_states(ctx, inputs, 0.0, unused);
  for (auto& blk : blocks_) blk->release();
  release_checkpoints();
  saved_ = Saved{};
  const int64_t b = inputs.dim(0), s = inputs.dim(1);
  Tensor last = Tensor::empty({b, model_.d_model}, prec_.compute);
  for (int64_t i = 0; i < b; ++i) last[i].copy_from(h[(i + 1) * s - 1]);
  Tensor logits = Tensor::empty({b, model_.vocab_size}, prec_.accum);
  kernels::MatmulArgs args;
  args.trans_b = true;
  kernels::matmul(ctx, last, head_->value, logits, args);
  return logits;
}

}  // namespace moetron::nn
