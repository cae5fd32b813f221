#include "moetron/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/rope.h"
#include "moetron/nn/linear.h"
#include "moetron/nn/recompute.h"
#include "moetron/nn/tensor_parallel_2d.h"

namespace moetron::nn {

SelfAttention::SelfAttention(const ModelConfig& cfg, int64_t layer, const std::string& prefix,
                             Precision prec, ParameterSet& params, const TensorParallel* tp)
    : tp_(tp ? tp : &no_tensor_parallel()),
      d_(cfg.d_model),
      h_(cfg.n_heads / tp_->size),
      hkv_(std::max<int64_t>(cfg.n_kv_heads / tp_->size, 1)),
      hd_(cfg.resolved_head_dim()),
      theta_(static_cast<float>(cfg.rope_theta)),
      prec_(prec) {
  const auto std = static_cast<float>(cfg.init_std);
  // GPT-2 style: the projection back into the residual stream is scaled by
  // 1/sqrt(2L) so the residual's variance does not grow with depth.
  const auto out_std =
      static_cast<float>(cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)));
  auto add = [&](const char* name, int64_t out, int64_t in, ParallelKind kind, float s) {
    return &params.add(prefix + name, {out, in}, prec.compute, prec.matrix_grad(), kind,
                       InitKind::normal, s, true);
  };
  const int64_t n = tp_->size, r = tp_->rank;
  MOETRON_CHECK(cfg.n_heads % n == 0, "model.n_heads = ", cfg.n_heads,
                " does not divide over parallel.tp = ", n);
  MOETRON_CHECK(cfg.n_kv_heads % n == 0 || n % cfg.n_kv_heads == 0,
                "model.n_kv_heads = ", cfg.n_kv_heads, " and parallel.tp = ", n,
                ": one must divide the other");
  kv_replicated_ = n > cfg.n_kv_heads;
  const int64_t kv_head0 = kv_replicated_ ? r / (n / cfg.n_kv_heads) : r * hkv_;
  wq_ = add("q_proj.weight", h_ * hd_, d_, ParallelKind::column, std);
  wk_ = add("k_proj.weight", hkv_ * hd_, d_, ParallelKind::column, std);
  wv_ = add("v_proj.weight", hkv_ * hd_, d_, ParallelKind::column, std);
  wo_ = add("o_proj.weight", d_, h_ * hd_, ParallelKind::row, out_std);
  if (tp_->on()) {
    ParameterSet::set_shard(*wq_, {cfg.n_heads * hd_, d_}, r * h_ * hd_, 0);
    ParameterSet::set_shard(*wk_, {cfg.n_kv_heads * hd_, d_}, kv_head0 * hd_, 0);
    ParameterSet::set_shard(*wv_, {cfg.n_kv_heads * hd_, d_}, kv_head0 * hd_, 0);
    ParameterSet::set_shard(*wo_, {d_, cfg.n_heads * hd_}, 0, r * h_ * hd_);
    wk_->shard.primary = wv_->shard.primary = !kv_replicated_ || r % (n / cfg.n_kv_heads) == 0;
    for (Parameter* w : {wq_, wk_, wv_, wo_}) split_over_grid_column(*tp_, *w);
  }
  mask_.causal = true;
  if (layer_is_local(cfg, layer)) {
    mask_.window = cfg.attention_window;
    mask_.num_global = cfg.attention_global_tokens;
  }
}

Tensor document_starts(const Tensor& positions, int64_t batch, int64_t seq) {
  const int32_t* pos = positions.data<int32_t>();
  bool packed = false;
  for (int64_t i = 0; i < batch * seq && !packed; ++i) packed = pos[i] != i % seq;
  if (!packed) return Tensor();
  Tensor starts = Tensor::empty({batch * seq}, DType::i32);
  for (int64_t i = 0; i < batch * seq; ++i)
    starts.data<int32_t>()[i] = static_cast<int32_t>(i % seq - pos[i]);
  return starts;
}

kernels::AttentionMask SelfAttention::mask_for(const Saved& s) const {
  kernels::AttentionMask m = mask_;
  if (s.doc_start.defined()) {
    m.doc_start = s.doc_start.data<int32_t>();
    m.doc_stride = s.seq;
  }
  return m;
}

void SelfAttention::forward(kernels::Context& ctx, const Tensor& x_given, const Tensor& positions,
                            int64_t batch, int64_t seq, const Tensor& y) {
  const int64_t t = batch * seq;
  const Tensor x = column_parallel_input(*tp_, x_given);
  check_shape(x, "attention input", {t, d_});
  Saved s;
  s.x = x;
  s.positions = positions;
  s.doc_start = document_starts(positions, batch, seq);
  s.batch = batch;
  s.seq = seq;
  s.q = Tensor::empty({batch, seq, h_, hd_}, prec_.compute);
  s.k = Tensor::empty({batch, seq, hkv_, hd_}, prec_.compute);
  s.v = Tensor::empty({batch, seq, hkv_, hd_}, prec_.compute);
  linear_forward(ctx, x, wq_->value, as_matrix(s.q, h_ * hd_));
  linear_forward(ctx, x, wk_->value, as_matrix(s.k, hkv_ * hd_));
  linear_forward(ctx, x, wv_->value, as_matrix(s.v, hkv_ * hd_));
  const Tensor q3 = s.q.reshape({t, h_, hd_}), k3 = s.k.reshape({t, hkv_, hd_});
  if (rope_) {
    kernels::rope_forward(ctx, q3, positions, theta_, q3);
    kernels::rope_forward(ctx, k3, positions, theta_, k3);
  }
  s.out = Tensor::empty({batch, seq, h_, hd_}, prec_.compute);
  s.lse = Tensor::empty({batch, h_, seq}, prec_.accum);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  if (context_parallel()) {
    MOETRON_CHECK(!cache_.on(), "context parallelism with chunked sequences");
    s.context_parallel = true;
    if (cp_->all_to_all) {
      ulysses_forward(ctx, s, scale);
    } else {
      s.doc_start = context_document_starts(positions, batch);
      ring_attention_forward(ctx, s, scale);
    }
  } else if (cache_.on()) {
    s.offset = cache_.offset;
    s.doc_start = Tensor();  // the cache holds the whole sequence's
    keep_chunk_kv(s);
    s.k = s.v = Tensor();
    chunk_attention_forward(ctx, s, scale, s.out, s.lse);
  } else {
    kernels::attention_forward(ctx, s.q, s.k, s.v, mask_for(s), scale, s.out, s.lse);
  }
  // Row-parallel o_proj: each rank's heads give a partial sum of y.
  const Tensor partial = tp_->sequence_parallel ? Tensor::empty({t, d_}, prec_.compute) : y;
  linear_forward(ctx, as_matrix(s.out, h_ * hd_), wo_->value, partial);
  if (tp_->on()) {
    const Tensor done = finish_row_parallel(*tp_, partial);
    if (done.raw() != y.raw()) y.copy_from(done);
  }
  if (drop_core_) s.out = s.out_heads = Tensor();
  // Projections are rebuilt from x on this rank alone: not where q, k, v are
  // gathered around a ring, exchanged or cached per chunk.
  const bool whole = !s.context_parallel && s.offset < 0;
  if (drop_q_ && whole) s.q = Tensor();
  if (drop_kv_ && whole) s.k = s.v = Tensor();
  saved_ = std::move(s);
}

void SelfAttention::rebuild_projections(kernels::Context& ctx) {
  Saved& s = saved_;
  // Only whole sequences on this rank dropped them (forward).
  if (s.context_parallel || s.offset >= 0 || (s.q.defined() && s.k.defined())) return;
  MOETRON_CHECK(s.x.defined(), "attention recompute of q, k, v without its input");
  const RecomputeTimer timer;
  const int64_t t = s.batch * s.seq;
  // The forward's kernels on the forward's input: the same values.
  if (!s.q.defined()) {
    s.q = Tensor::empty({s.batch, s.seq, h_, hd_}, prec_.compute);
    linear_forward(ctx, s.x, wq_->value, as_matrix(s.q, h_ * hd_));
    const Tensor q3 = s.q.reshape({t, h_, hd_});
    if (rope_) kernels::rope_forward(ctx, q3, s.positions, theta_, q3);
  }
  if (!s.k.defined()) {
    s.k = Tensor::empty({s.batch, s.seq, hkv_, hd_}, prec_.compute);
    s.v = Tensor::empty({s.batch, s.seq, hkv_, hd_}, prec_.compute);
    linear_forward(ctx, s.x, wk_->value, as_matrix(s.k, hkv_ * hd_));
    linear_forward(ctx, s.x, wv_->value, as_matrix(s.v, hkv_ * hd_));
    const Tensor k3 = s.k.reshape({t, hkv_, hd_});
    if (rope_) kernels::rope_forward(ctx, k3, s.positions, theta_, k3);
  }
}

void SelfAttention::rebuild_output(kernels::Context& ctx, float scale) {
  Saved& s = saved_;
  if (s.out.defined()) return;
  const RecomputeTimer timer;
  if (s.ulysses) return ulysses_core(ctx, s, scale);  // attn_core (all-to-all included)
  // attn_core recompute: the same kernel on the same q, k, v.
  s.out = Tensor::empty(s.q.shape(), prec_.compute);
  Tensor lse = Tensor::empty(s.lse.shape(), prec_.accum);
  if (s.context_parallel) {
    context_attention_forward(ctx, s, scale, s.out, lse);
  } else if (s.offset >= 0) {
    chunk_attention_forward(ctx, s, scale, s.out, lse);
  } else {
    kernels::attention_forward(ctx, s.q, s.k, s.v, mask_for(s), scale, s.out, lse);
  }
}

void SelfAttention::project_output(kernels::Context& ctx, const Tensor& y) {
  MOETRON_CHECK(!tp_->on(), "attention: o_proj recompute under tensor parallelism");
  Saved& s = saved_;
  if (!s.out.defined()) {
    rebuild_projections(ctx);
    rebuild_output(ctx, 1.0f / std::sqrt(static_cast<float>(hd_)));
  }
  linear_forward(ctx, as_matrix(s.out, h_ * hd_), wo_->value, y);
}

void SelfAttention::backward(kernels::Context& ctx, const Tensor& dy_given, const Tensor& dx) {
  const Tensor dy = column_parallel_input(*tp_, dy_given);
  Saved& s = saved_;
  MOETRON_CHECK(s.lse.defined() && s.x.defined(), "attention backward without a saved forward");
  const bool chunked = s.offset >= 0;
  MOETRON_CHECK(!chunked || cache_.on(), "attention backward of a sequence chunk after its ",
                "sequence ended");
  const int64_t t = s.batch * s.seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  rebuild_projections(ctx);
  rebuild_output(ctx, scale);
  Tensor d_out = Tensor::empty(s.out.shape(), prec_.compute);
  linear_backward(ctx, dy, as_matrix(s.out, h_ * hd_), wo_->value, wo_->grad,
                  as_matrix(d_out, h_ * hd_));
  const Shape kv_shape{s.batch, s.seq, hkv_, hd_};
  Tensor dq = Tensor::empty({s.batch, s.seq, h_, hd_}, prec_.compute);
  Tensor dk = Tensor::empty(kv_shape, prec_.compute);
  Tensor dv = Tensor::empty(kv_shape, prec_.compute);
  if (s.ulysses) {
    ulysses_backward(ctx, s, d_out, scale, dq, dk, dv);
  } else if (s.context_parallel) {
    context_attention_backward(ctx, s, d_out, scale, dq, dk, dv);
  } else if (chunked) {
    chunk_attention_backward(ctx, s, d_out, scale, dq, dk, dv);
  } else {
    kernels::attention_backward(ctx, d_out, s.q, s.k, s.v, s.out, s.lse, mask_for(s), scale, dq, dk,
                                dv);
  }
  d_out = Tensor();
  const Tensor dq3 = dq.reshape({t, h_, hd_}), dk3 = dk.reshape({t, hkv_, hd_});
  if (rope_) {
    kernels::rope_backward(ctx, dq3, s.positions, theta_, dq3);
    kernels::rope_backward(ctx, dk3, s.positions, theta_, dk3);
  }
  // Column-parallel q/k/v: each rank's heads give a partial sum of dx.
  const Tensor dx_partial = tp_->sequence_parallel ? Tensor::empty({t, d_}, prec_.compute) : dx;
  linear_backward(ctx, as_matrix(dq, h_ * hd_), s.x, wq_->value, wq_->grad, dx_partial, 0.0f);
  if (kv_replicated_ && tp_->kv_group && tp_->kv_group->size() > 1) {
    // The ranks sharing this kv head each saw only their query heads'
    // share of dk, dv: sum this micro-batch's weight gradients over them.
    for (auto [d, w] : {std::pair{&dk, wk_}, std::pair{&dv, wv_}}) {
      Tensor dw = Tensor::zeros(w->grad.shape(), w->grad.dtype(), MemTag::workspace);
      linear_backward(ctx, as_matrix(*d, hkv_ * hd_), s.x, w->value, dw, dx_partial, 1.0f);
      tp_->kv_group->allreduce(dw, comm::ReduceOp::sum);
      kernels::add(ctx, w->grad, dw, w->grad);
    }
  } else {
    linear_backward(ctx, as_matrix(dk, hkv_ * hd_), s.x, wk_->value, wk_->grad, dx_partial, 1.0f);
    linear_backward(ctx, as_matrix(dv, hkv_ * hd_), s.x, wv_->value, wv_->grad, dx_partial, 1.0f);
  }
  if (tp_->on()) {
    const Tensor done = finish_row_parallel(*tp_, dx_partial);
    if (done.raw() != dx.raw()) dx.copy_from(done);
  }
  release();
}

std::vector<GridSlot> SelfAttention::grid_slots() {
  return {grid_slot(*wq_), grid_slot(*wk_), grid_slot(*wv_), grid_slot(*wo_)};
}

void SelfAttention::release() {
  saved_ = Saved{};
}

}  // namespace moetron::nn
