#include "moetron/nn/parameter_inventory.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/nn/tensor_parallel_2d.h"
#include "moetron/nn/transformer.h"

namespace moetron::nn {

namespace {

// Registers parameters in the order the modules do (nn/transformer.cpp,
// block.cpp, attention.cpp, mlp.cpp, moe.cpp).
class InventoryBuilder {
 public:
  InventoryBuilder(const ModelConfig& m, const MoeConfig& e, Precision prec, ExpertParallel ep,
                   const TensorParallel& tp, std::string layers_prefix = "model.layers.")
      : m_(m), e_(e), prec_(prec), ep_(ep), tp_(tp), layers_prefix_(std::move(layers_prefix)) {}

  ParamInventory take() { return std::move(inv_); }

  ParamInfo& add(const std::string& name, const Shape& shape, DType value, DType grad,
                 ParallelKind kind, bool hidden) {
    inv_.value_buffers.emplace_back(shape.numel(), value);
    inv_.grad_buffers.emplace_back(shape.numel(), grad);
    return view(name, shape, value, grad, kind, hidden);
  }
  ParamInfo& view(const std::string& name, const Shape& shape, DType value, DType grad,
                  ParallelKind kind, bool hidden) {
    ParamInfo p;
    p.name = name;
    p.shape = shape;
    p.value = value;
    p.grad = grad;
    p.kind = kind;
    p.hidden_matrix = hidden;
    inv_.params.push_back(std::move(p));
    return inv_.params.back();
  }
  static void shard(ParamInfo& p, const Shape& full, int64_t row0, int64_t col0) {
    p.full = full;
    p.row0 = row0;
    p.col0 = col0;
  }

  // Where the next add()'s buffers go (value and grad lists differ: the
  // router's selection bias has no gradient).
  std::pair<size_t, size_t> next_buffers() const {
    return {inv_.value_buffers.size(), inv_.grad_buffers.size()};
  }
  // 2-D grid (nn/tensor_parallel_2d.h): the tp block of inv_.params[i],
  // which owns buffers `bufs`, split by rows over the grid column.
  void split_over_grid_column(size_t i, std::pair<size_t, size_t> bufs) {
    if (!tp_.grid()) return;
    ParamInfo& p = inv_.params[i];
    p.shape[0] = grid_block_rows(tp_, p.shape[0], p.name);
    p.row0 += tp_.grid_row * p.shape[0];
    inv_.value_buffers[bufs.first].first = inv_.grad_buffers[bufs.second].first = p.numel();
  }

  void vocab(const char* name) {
    const int64_t v = m_.vocab_size / tp_.size;
    const auto buf = next_buffers();
    const size_t i = inv_.params.size();
    ParamInfo& p =
        add(name, {v, m_.d_model}, prec_.compute, prec_.accum, ParallelKind::vocab, false);
    if (!tp_.on()) return;
    shard(p, {m_.vocab_size, m_.d_model}, tp_.rank * v, 0);
    split_over_grid_column(i, buf);
  }

  void block(int64_t i) {
    const std::string pre = layers_prefix_ + std::to_string(i) + ".";
    const DType a = prec_.accum;
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
      add(pre + norm, {m_.d_model}, a, a, ParallelKind::replicated, false).grad_partial_over_tp =
          tp_.sequence_parallel;
    }
    attention(pre + "self_attn.");
    if (!layer_is_moe(e_, i)) {
      swiglu(pre + "mlp.", m_.ffn_hidden, tp_);
      return;
    }
    const size_t first = inv_.params.size();
    moe(pre);
    for (size_t k = first; k < inv_.params.size(); ++k)
      inv_.params[k].grad_partial_over_tp = tp_.on();
  }

  // GatedCrossAttention (nn/cross_attention.h) before block i: its
  // constructor's order (the first norm, the MLP, the projections, the
  // gates around the second norm); nothing tp-sharded.
  void cross_attention(int64_t i) {
    const std::string pre = layers_prefix_ + std::to_string(i) + ".cross_attn.";
    const int64_t d = m_.d_model, hd = m_.resolved_head_dim();
    const DType a = prec_.accum, c = prec_.compute, g = prec_.matrix_grad();
    const auto r = ParallelKind::replicated;
    add(pre + "input_layernorm.weight", {d}, a, a, r, false);
    swiglu(pre + "mlp.", m_.ffn_hidden, no_tensor_parallel());
    add(pre + "q_proj.weight", {m_.n_heads * hd, d}, c, g, r, true);
    add(pre + "k_proj.weight", {m_.n_kv_heads * hd, d}, c, g, r, true);
    add(pre + "v_proj.weight", {m_.n_kv_heads * hd, d}, c, g, r, true);
    add(pre + "o_proj.weight", {d, m_.n_heads * hd}, c, g, r, true);
    add(pre + "attn_gate", {1}, a, a, r, false);
    add(pre + "post_attention_layernorm.weight", {d}, a, a, r, false);
    add(pre + "mlp_gate", {1}, a, a, r, false);
  }

 private:
  void attention(const std::string& pre) {
    const int64_t n = tp_.size, r = tp_.rank, d = m_.d_model, hd = m_.resolved_head_dim();
    const int64_t h = m_.n_heads / n, hkv = std::max<int64_t>(m_.n_kv_heads / n, 1);
    const bool kv_replicated = n > m_.n_kv_heads;
    const int64_t kv_head0 = kv_replicated ? r / (n / m_.n_kv_heads) : r * hkv;
    const DType c = prec_.compute, g = prec_.matrix_grad();
    const size_t qi = inv_.params.size();
    const auto qb = next_buffers();
    add(pre + "q_proj.weight", {h * hd, d}, c, g, ParallelKind::column, true);
    add(pre + "k_proj.weight", {hkv * hd, d}, c, g, ParallelKind::column, true);
    add(pre + "v_proj.weight", {hkv * hd, d}, c, g, ParallelKind::column, true);
    add(pre + "o_proj.weight", {d, h * hd}, c, g, ParallelKind::row, true);
    if (!tp_.on()) return;
    ParamInfo* w = &inv_.params[qi];
    shard(w[0], {m_.n_heads * hd, d}, r * h * hd, 0);
    shard(w[1], {m_.n_kv_heads * hd, d}, kv_head0 * hd, 0);
    shard(w[2], {m_.n_kv_heads * hd, d}, kv_head0 * hd, 0);
    shard(w[3], {d, m_.n_heads * hd}, 0, r * h * hd);
    w[1].primary = w[2].primary = !kv_replicated || r % (n / m_.n_kv_heads) == 0;
    for (size_t k = 0; k < 4; ++k) split_over_grid_column(qi + k, {qb.first + k, qb.second + k});
  }

  // SwiGluMlp: gate and up are views of one fused buffer; tp shards the hidden units.
  void swiglu(const std::string& pre, int64_t hidden, const TensorParallel& tp) {
    const int64_t d = m_.d_model, f = hidden / tp.size;
    // Under a 2-D grid the fused buffer holds this rank's block of the gate
    // rows and of the up rows (nn/mlp.cpp).
    const int64_t rows = tp.grid() ? grid_block_rows(tp, f, pre + "gate_proj.weight") : f;
    const DType c = prec_.compute, g = prec_.matrix_grad();
    inv_.value_buffers.emplace_back(2 * rows * d, c);
    inv_.grad_buffers.emplace_back(2 * rows * d, g);
    const size_t first = inv_.params.size();
    const auto down_buf = next_buffers();
    view(pre + "gate_proj.weight", {rows, d}, c, g, ParallelKind::column, true);
    view(pre + "up_proj.weight", {rows, d}, c, g, ParallelKind::column, true);
    add(pre + "down_proj.weight", {d, f}, c, g, ParallelKind::row, true);
    if (!tp.on()) return;
    ParamInfo* w = &inv_.params[first];
    const int64_t row0 = tp.rank * f + (tp.grid() ? tp.grid_row * rows : 0);
    shard(w[0], {hidden, d}, row0, 0);
    shard(w[1], {hidden, d}, row0, 0);
    shard(w[2], {d, hidden}, 0, tp.rank * f);
    split_over_grid_column(first + 2, down_buf);
  }

  // MoeLayer: the router, this rank's experts (fused w1|w3 and w2 buffers
  // over the local experts, named by their global index), the selection
  // bias, the shared experts (not tp-sharded: the tp ranks split tokens).
  void moe(const std::string& pre) {
    const int64_t d = m_.d_model, f = e_.expert_hidden, local = e_.num_experts / ep_.size;
    const DType c = prec_.compute, a = prec_.accum, g = prec_.matrix_grad();
    add(pre + "block_sparse_moe.gate.weight", {e_.num_experts, d}, a, a, ParallelKind::replicated,
        false);
    inv_.value_buffers.emplace_back(local * 2 * f * d, c);
    inv_.grad_buffers.emplace_back(local * 2 * f * d, g);
    inv_.value_buffers.emplace_back(local * d * f, c);
    inv_.grad_buffers.emplace_back(local * d * f, g);
    for (int64_t jl = 0; jl < local; ++jl) {
      const int64_t j = ep_.rank * local + jl;
      const std::string ex = pre + "block_sparse_moe.experts." + std::to_string(j) + ".";
      view(ex + "w1.weight", {f, d}, c, g, ParallelKind::expert, true).expert = j;
      view(ex + "w3.weight", {f, d}, c, g, ParallelKind::expert, true).expert = j;
      view(ex + "w2.weight", {d, f}, c, g, ParallelKind::expert, true).expert = j;
    }
    inv_.value_buffers.emplace_back(e_.num_experts, a);  // selection bias
    if (e_.shared_experts > 0) {
      const int64_t hidden =
          (e_.shared_expert_hidden > 0 ? e_.shared_expert_hidden : f) * e_.shared_experts;
      swiglu(pre + "mlp.shared_experts.", hidden, no_tensor_parallel());
    }
    if (e_.modality_routing == "prior") {  // nn/modality_routing.h
      add(pre + "block_sparse_moe.gate.modality_embed", {e_.num_modalities, d}, a, a,
          ParallelKind::replicated, false);
      add(pre + "block_sparse_moe.gate.modality_bias", {e_.num_modalities, e_.num_experts}, a, a,
          ParallelKind::replicated, false);
    }
  }

  const ModelConfig& m_;
  const MoeConfig& e_;
  Precision prec_;
  ExpertParallel ep_;
  const TensorParallel& tp_;
  std::string layers_prefix_;
  ParamInventory inv_;
};

// An encoder's transformer (nn/encoder_trunk.h): its projector, its
// non-causal dense blocks named under `root`, its final norm.
void encoder_trunk(InventoryBuilder& b, const EncoderTransformerConfig& e, const std::string& root,
                   int64_t d_lm, Precision prec) {
  const DType c = prec.compute, g = prec.matrix_grad(), a = prec.accum;
  b.add(root + "projector.0.weight", {d_lm, e.d_model}, c, g, ParallelKind::replicated, true);
  b.add(root + "projector.2.weight", {d_lm, d_lm}, c, g, ParallelKind::replicated, true);
  for (int64_t i = 0; i < e.n_layers; ++i) b.block(i);
  b.add(root + "norm.weight", {e.d_model}, a, a, ParallelKind::replicated, false);
}

void append(ParamInventory& to, ParamInventory from) {
  for (auto& p : from.params) to.params.push_back(std::move(p));
  for (auto& v : from.value_buffers) to.value_buffers.push_back(v);
  for (auto& v : from.grad_buffers) to.grad_buffers.push_back(v);
}

// The encoders nn::MediaFusion adds: vision (nn/vision_encoder.h), then audio
// (nn/audio_encoder.h), each in its constructor's order.
ParamInventory media_inventory(const MultimodalModelConfig& cfg, int64_t d_lm, Precision prec) {
  MoeConfig dense;
  dense.num_experts = 0;
  const DType c = prec.compute, a = prec.accum;
  const VisionConfig& v = cfg.vision;
  const ModelConfig vm = encoder_block_config(v.transformer);
  InventoryBuilder vb(vm, dense, prec, {}, no_tensor_parallel(), "vision.layers.");
  const int64_t dv = v.transformer.d_model;
  vb.add("vision.patch_embed.weight", {dv, v.channels * v.patch * v.patch}, c, a,
         ParallelKind::replicated, false);
  vb.add("vision.pos_embed_row.weight", {v.max_rows, dv}, c, a, ParallelKind::replicated, false);
  vb.add("vision.pos_embed_col.weight", {v.max_cols, dv}, c, a, ParallelKind::replicated, false);
  encoder_trunk(vb, v.transformer, "vision.", d_lm, prec);
  ParamInventory inv = vb.take();
  const AudioConfig& au = cfg.audio;
  const ModelConfig am = encoder_block_config(au.transformer);
  InventoryBuilder ab(am, dense, prec, {}, no_tensor_parallel(), "audio.layers.");
  encoder_trunk(ab, au.transformer, "audio.", d_lm, prec);
  const int64_t da = au.transformer.d_model, k = au.conv_kernel;
  ab.add("audio.conv1.weight", {da, au.n_mels, k}, c, a, ParallelKind::replicated, false);
  ab.add("audio.conv1.bias", {da}, c, a, ParallelKind::replicated, false);
  ab.add("audio.conv2.weight", {da, da, k}, c, a, ParallelKind::replicated, false);
  ab.add("audio.conv2.bias", {da}, c, a, ParallelKind::replicated, false);
  append(inv, ab.take());
  return inv;
}

}  // namespace

ParamInventory parameter_inventory(const ModelConfig& model, const MoeConfig& moe, Precision prec,
                                   ExpertParallel ep, const TensorParallel& tp,
                                   const PipelinePlace& place, const MultimodalModelConfig* media) {
  MOETRON_CHECK(tp.size >= 1 && model.vocab_size % tp.size == 0 && model.n_heads % tp.size == 0,
                "parameter inventory: parallel.tp = ", tp.size,
                " must divide model.vocab_size and model.n_heads");
  MOETRON_CHECK(ep.size >= 1 && (moe.num_experts == 0 || moe.num_experts % ep.size == 0),
                "parameter inventory: parallel.ep = ", ep.size, " must divide moe.num_experts");
  InventoryBuilder b(model, moe, prec, ep, tp);
  if (place.embedding) b.vocab("model.embed_tokens.weight");
  const std::vector<std::pair<int64_t, int64_t>> all = {{0, model.n_layers}};
  for (const auto& [first, end] : place.chunks.empty() ? all : place.chunks) {
    for (int64_t i = first; i < end; ++i) b.block(i);
  }
  if (place.head) {
    b.add("model.norm.weight", {model.d_model}, prec.accum, prec.accum, ParallelKind::replicated,
          false)
        .grad_partial_over_tp = tp.sequence_parallel;
    if (!model.tie_embeddings) b.vocab("lm_head.weight");
  }
  // Transformer::enable_media: the cross-attention layers of the held
  // blocks, in block order, before the encoders.
  if (media) {
    for (const auto& [first, end] : place.chunks.empty() ? all : place.chunks) {
      for (int64_t i = first; i < end; ++i) {
        if (media->cross_attention_at(i)) b.cross_attention(i);
      }
    }
  }
  ParamInventory inv = b.take();
  // The encoders live with the embedding (Transformer::enable_media).
  if (media && media->enabled && place.embedding)
    append(inv, media_inventory(*media, model.d_model, prec));
  return inv;
}

std::vector<ParamInfo> describe_parameters(const ParameterSet& params) {
  std::vector<ParamInfo> out;
  out.reserve(params.all().size());
  for (const auto& p : params.all()) {
    ParamInfo i;
    i.name = p->name;
    i.shape = p->value.shape();
    i.value = p->value.dtype();
    i.grad = p->grad.dtype();
    i.kind = p->kind;
    i.hidden_matrix = p->hidden_matrix;
    i.expert = p->expert;
    i.grad_partial_over_tp = p->grad_partial_over_tp;
    i.full = p->shard.full;
    i.row0 = p->shard.row0;
    i.col0 = p->shard.col0;
    i.primary = p->shard.primary;
    out.push_back(std::move(i));
  }
  return out;
}

std::string first_difference(const std::vector<ParamInfo>& a, const std::vector<ParamInfo>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const ParamInfo &x = a[i], &y = b[i];
    if (x == y) continue;
    std::string what = "parameter " + std::to_string(i) + " '" + x.name + "'";
    if (x.name != y.name) return what + ": named '" + y.name + "' in the other";
    if (!(x.shape == y.shape)) return what + ": shape " + x.shape.str() + " vs " + y.shape.str();
    if (x.value != y.value || x.grad != y.grad) return what + ": dtypes differ";
    if (x.kind != y.kind || x.hidden_matrix != y.hidden_matrix || x.expert != y.expert) {
      return what + ": kind, hidden_matrix or expert index differ";
    }
    if (x.grad_partial_over_tp != y.grad_partial_over_tp)
      return what + ": grad_partial_over_tp differs";
    return what + ": tp shard placement differs";
  }
  if (a.size() != b.size()) {
    return std::to_string(a.size()) + " parameters vs " + std::to_string(b.size());
  }
  return "";
}

}  // namespace moetron::nn
