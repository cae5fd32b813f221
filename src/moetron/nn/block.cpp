#include "moetron/nn/block.h"

#include <cmath>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/norm.h"
#include "moetron/nn/recompute.h"
#include "moetron/nn/tensor_parallel_2d.h"

namespace moetron::nn {

Block::Block(const ModelConfig& model, const MoeConfig& moe, int64_t index, Precision prec,
             ParameterSet& params, ExpertParallel ep, const TensorParallel* tp,
             const BlockOptions& options)
    : Block(model, moe, index, prec, params, ep, tp,
            options.layers_prefix + std::to_string(index) + ".") {
  attn_.set_causal(options.causal);
  attn_.set_rope(options.rope);
}

Block::Block(const ModelConfig& model, const MoeConfig& moe, int64_t index, Precision prec,
             ParameterSet& params, ExpertParallel ep, const TensorParallel* tp,
             const std::string& prefix)
    : tp_(tp ? tp : &no_tensor_parallel()),
      prefix_(prefix),
      index_(index),
      d_(model.d_model),
      eps_(static_cast<float>(model.norm_eps)),
      prec_(prec),
      norm1_(&params.add(prefix + "input_layernorm.weight", {model.d_model}, prec.accum, prec.accum,
                         ParallelKind::replicated, InitKind::ones, 0, false)),
      norm2_(&params.add(prefix + "post_attention_layernorm.weight", {model.d_model}, prec.accum,
                         prec.accum, ParallelKind::replicated, InitKind::ones, 0, false)),
      attn_(model, index, prefix + "self_attn.", prec, params, tp_) {
  // Under sequence parallelism each rank's norms see its token slice only.
  norm1_->grad_partial_over_tp = norm2_->grad_partial_over_tp = tp_->sequence_parallel;
  if (layer_is_moe(moe, index)) {
    const size_t first = params.all().size();
    moe_ = std::make_unique<MoeLayer>(model, moe, prefix, prec, params, ep);
    for (size_t i = first; i < params.all().size(); ++i) {
      Parameter& p = *params.all()[i];
      p.grad_partial_over_tp =
          tp_->on();  // router, shared and routed experts (unless ep places them)
    }
  } else {
    const auto std = static_cast<float>(model.init_std);
    const auto out_std =
        static_cast<float>(model.init_std / std::sqrt(2.0 * static_cast<double>(model.n_layers)));
    mlp_ = std::make_unique<SwiGluMlp>(model.d_model, model.ffn_hidden, prefix + "mlp.", std,
                                       out_std, prec, params, tp_);
  }
}

void Block::add_cross_attention(const ModelConfig& model, ParameterSet& params) {
  MOETRON_CHECK(!xattn_, prefix_, " already has a cross-attention layer");
  // Without sequence parallelism every tp rank holds the whole activations
  // and every media token: each runs the (replicated) layer in full.
  MOETRON_CHECK(!tp_->sequence_parallel,
                "gated cross-attention layers (multimodal.fusion) with sequence parallelism are "
                "not supported yet");
  xattn_ = std::make_unique<GatedCrossAttention>(model, prefix_ + "cross_attn.", prec_, params);
}

Tensor Block::forward(kernels::Context& ctx, const Tensor& x_in, const Tensor& positions,
                      int64_t batch, int64_t seq, double loss_weight, MoeStats& moe_stats,
                      const MediaTokens* media) {
  // 2-D grid: this block's weights gathered for this use only (recompute
  // runs through here too).
  GridGather grid(*tp_);
  grid.gather(grid_slots(), true, false);
  const Tensor x = xattn_ ? xattn_->forward(ctx, x_in, media ? media->tokens : Tensor(), batch, seq,
                                            media ? media->lengths : std::vector<int64_t>{})
                          : x_in;
  const int64_t t = x.dim(0);
  Saved s;
  s.x = x;
  s.rstd1 = Tensor::empty({t}, prec_.accum);
  Tensor n1 = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, norm1_->value, eps_, n1, s.rstd1);
  s.h = Tensor::empty({t, d_}, prec_.compute);
  attn_.forward(ctx, n1, positions, batch, seq, s.h);
  if (drop_norm_) attn_.drop_input();
  kernels::add(ctx, s.h, x, s.h);
  s.rstd2 = Tensor::empty({t}, prec_.accum);
  Tensor n2 = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_forward(ctx, s.h, norm2_->value, eps_, n2, s.rstd2);
  Tensor out = Tensor::empty({t, d_}, prec_.compute);
  if (moe_) {
    const bool sliced = moe_slices_tokens();
    const Tensor moe_out = sliced ? Tensor::empty({tp_->slice_rows(t), d_}, prec_.compute) : out;
    const MoeStats st =
        moe_->forward(ctx, sliced ? token_slice(*tp_, n2) : n2, moe_out, loss_weight);
    if (sliced) tp_->group->allgather(moe_out, out);
    moe_stats.aux_loss += st.aux_loss;
    moe_stats.z_loss += st.z_loss;
    moe_stats.entropy_loss += st.entropy_loss;
    moe_stats.dropped += st.dropped;
  } else {
    mlp_->forward(ctx, n2, out);
  }
  if (drop_norm_ && moe_) moe_->drop_input();
  if (drop_norm_ && mlp_) mlp_->drop_input();
  kernels::add(ctx, out, s.h, out);
  if (drop_residual_) s.h = Tensor();
  if (track_activations_) {
    act_sum_squares_ += kernels::sum_squares(ctx, out);
    act_count_ += out.numel();
  }
  saved_ = std::move(s);
  return out;
}

Tensor Block::backward(kernels::Context& ctx, const Tensor& d_out, const Tensor& d_media) {
  Saved& s = saved_;
  MOETRON_CHECK(s.x.defined(), "block backward without a saved forward");
  // 2-D grid: gathered again (nothing is kept since forward), and the
  // gradients summed back into the stored blocks before backward returns.
  GridGather grid(*tp_);
  grid.gather(grid_slots(), true, true);
  const int64_t t = s.x.dim(0);
  if (!s.h.defined()) rebuild_residual(ctx);
  Tensor d_n2 = Tensor::empty({t, d_}, prec_.compute);
  if (drop_norm_) {
    const Tensor n2 = rebuild_norm(ctx, s.h, *norm2_);
    if (moe_) moe_->restore_input(moe_slices_tokens() ? token_slice(*tp_, n2) : n2);
    if (mlp_) mlp_->restore_input(n2);
  }
  if (moe_slices_tokens()) {
    // Each rank's slice of the replicated input got its gradient here only.
    Tensor d_slice = Tensor::empty({tp_->slice_rows(t), d_}, prec_.compute);
    moe_->backward(ctx, token_slice(*tp_, d_out), d_slice);
    tp_->group->allgather(d_slice, d_n2);
  } else if (moe_) {
    moe_->backward(ctx, d_out, d_n2);
  } else {
    mlp_->backward(ctx, d_out, d_n2);
  }
  Tensor d_h = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_backward(ctx, d_n2, s.h, norm2_->value, s.rstd2, d_h, norm2_->grad);
  kernels::add(ctx, d_h, d_out, d_h);
  Tensor d_n1 = std::move(d_n2);  // same shape; reuse the buffer
  if (drop_norm_ && !attn_.has_input()) attn_.restore_input(rebuild_norm(ctx, s.x, *norm1_));
  attn_.backward(ctx, d_h, d_n1);
  Tensor d_x = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_backward(ctx, d_n1, s.x, norm1_->value, s.rstd1, d_x, norm1_->grad);
  kernels::add(ctx, d_x, d_h, d_x);
  if (xattn_) d_x = xattn_->backward(ctx, d_x, d_media);
  grid.finish(ctx);
  release();
  return d_x;
}

void Block::rebuild_residual(kernels::Context& ctx) {
  // attn_residual: h = x + o_proj(attention output), the forward's kernels
  // on the forward's values. A dropped attention output is rebuilt first,
  // from the input (itself rebuilt if norm dropped it).
  const RecomputeTimer timer;
  Saved& s = saved_;
  if (!attn_.has_output() && !attn_.has_input())
    attn_.restore_input(rebuild_norm(ctx, s.x, *norm1_));
  s.h = Tensor::empty({s.x.dim(0), d_}, prec_.compute);
  attn_.project_output(ctx, s.h);
  kernels::add(ctx, s.h, s.x, s.h);
}

Tensor Block::rebuild_norm(kernels::Context& ctx, const Tensor& x, const Parameter& w) const {
  // The forward's kernel on the forward's input: the same output.
  const RecomputeTimer timer;
  const int64_t t = x.dim(0);
  Tensor rstd = Tensor::empty({t}, prec_.accum);
  Tensor n = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, w.value, eps_, n, rstd);
  return n;
}

void Block::set_recompute(uint32_t modules) {
  const auto has = [&](Recompute m) { return (modules & static_cast<uint32_t>(m)) != 0; };
  drop_norm_ = has(Recompute::norm);
  // Under tp o_proj's output is a sum over ranks: rebuilding it would be a collective.
  drop_residual_ = has(Recompute::attn_residual) && !tp_->on();
  attn_.set_drop_core(has(Recompute::attn_core));
  attn_.set_drop_projections(has(Recompute::attn_q), has(Recompute::attn_kv));
  if (mlp_) mlp_->set_drop_act(has(Recompute::moe_act));
  if (moe_) {
    moe_->set_recompute(has(Recompute::moe_act), has(Recompute::moe_dispatch),
                        has(Recompute::moe_out));
  }
}

void Block::set_checkpointed(bool on) {
  if (moe_) moe_->set_keep_routing(on);
}

Tensor Block::recompute_forward(kernels::Context& ctx, const Tensor& x, const Tensor& positions,
                                int64_t batch, int64_t seq, double loss_weight,
                                const MediaTokens* media) {
  const RecomputeTimer timer;
  MoeStats unused;  // counted by the first forward, as are the activation sums
  if (moe_) moe_->set_recompute_pass(true);
  const bool tracking = std::exchange(track_activations_, false);
  try {
    Tensor out = forward(ctx, x, positions, batch, seq, loss_weight, unused, media);
    if (moe_) moe_->set_recompute_pass(false);
    track_activations_ = tracking;
    return out;
  } catch (...) {
    if (moe_) moe_->set_recompute_pass(false);
    track_activations_ = tracking;
    throw;
  }
}

std::vector<GridSlot> Block::grid_slots() {
  std::vector<GridSlot> slots = attn_.grid_slots();
  if (mlp_) {
    for (GridSlot& s : mlp_->grid_slots()) slots.push_back(std::move(s));
  }
  return slots;
}

void Block::release() {
  saved_ = Saved{};
  attn_.release();
  if (mlp_) mlp_->release();
  if (moe_) moe_->release();
  if (xattn_) xattn_->release();
}

}  // namespace moetron::nn
