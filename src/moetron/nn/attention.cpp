#include "moetron/nn/attention.h"

#include <cmath>

#include "moetron/kernels/rope.h"
#include "moetron/nn/linear.h"

namespace moetron::nn {

SelfAttention::SelfAttention(const ModelConfig& cfg, const std::string& prefix, Precision prec,
                             ParameterSet& params)
    : d_(cfg.d_model),
      h_(cfg.n_heads),
      hkv_(cfg.n_kv_heads),
      hd_(cfg.resolved_head_dim()),
      theta_(static_cast<float>(cfg.rope_theta)),
      prec_(prec) {
  const auto std = static_cast<float>(cfg.init_std);
  // GPT-2 style: the projection back into the residual stream is scaled by
  // 1/sqrt(2L) so the residual's variance does not grow with depth.
  const auto out_std = static_cast<float>(cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)));
  auto add = [&](const char* name, int64_t out, int64_t in, ParallelKind kind, float s) {
    return &params.add(prefix + name, {out, in}, prec.compute, prec.accum, kind, InitKind::normal, s,
                       true);
  };
  wq_ = add("q_proj.weight", h_ * hd_, d_, ParallelKind::column, std);
  wk_ = add("k_proj.weight", hkv_ * hd_, d_, ParallelKind::column, std);
  wv_ = add("v_proj.weight", hkv_ * hd_, d_, ParallelKind::column, std);
  wo_ = add("o_proj.weight", d_, h_ * hd_, ParallelKind::row, out_std);
  mask_.causal = true;
}

void SelfAttention::forward(kernels::Context& ctx, const Tensor& x, const Tensor& positions,
                            int64_t batch, int64_t seq, const Tensor& y) {
  const int64_t t = batch * seq;
  check_shape(x, "attention input", {t, d_});
  Saved s;
  s.x = x;
  s.positions = positions;
  s.batch = batch;
  s.seq = seq;
  s.q = Tensor::empty({batch, seq, h_, hd_}, prec_.compute);
  s.k = Tensor::empty({batch, seq, hkv_, hd_}, prec_.compute);
  s.v = Tensor::empty({batch, seq, hkv_, hd_}, prec_.compute);
  linear_forward(ctx, x, wq_->value, as_matrix(s.q, h_ * hd_));
  linear_forward(ctx, x, wk_->value, as_matrix(s.k, hkv_ * hd_));
  linear_forward(ctx, x, wv_->value, as_matrix(s.v, hkv_ * hd_));
  const Tensor q3 = s.q.reshape({t, h_, hd_}), k3 = s.k.reshape({t, hkv_, hd_});
  kernels::rope_forward(ctx, q3, positions, theta_, q3);
  kernels::rope_forward(ctx, k3, positions, theta_, k3);
  s.out = Tensor::empty({batch, seq, h_, hd_}, prec_.compute);
  s.lse = Tensor::empty({batch, h_, seq}, prec_.accum);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  kernels::attention_forward(ctx, s.q, s.k, s.v, mask_, scale, s.out, s.lse);
  linear_forward(ctx, as_matrix(s.out, h_ * hd_), wo_->value, y);
  if (drop_core_) s.out = Tensor();
  saved_ = std::move(s);
}

void SelfAttention::backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx) {
  Saved& s = saved_;
  MOETRON_CHECK(s.q.defined() && s.x.defined(), "attention backward without a saved forward");
  const int64_t t = s.batch * s.seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  if (!s.out.defined()) {  // attn_core recompute: the same kernel on the same q, k, v
    s.out = Tensor::empty(s.q.shape(), prec_.compute);
    Tensor lse = Tensor::empty(s.lse.shape(), prec_.accum);
    kernels::attention_forward(ctx, s.q, s.k, s.v, mask_, scale, s.out, lse);
  }
  Tensor d_out = Tensor::empty(s.out.shape(), prec_.compute);
  linear_backward(ctx, dy, as_matrix(s.out, h_ * hd_), wo_->value, wo_->grad, as_matrix(d_out, h_ * hd_));
  Tensor dq = Tensor::empty(s.q.shape(), prec_.compute);
  Tensor dk = Tensor::empty(s.k.shape(), prec_.compute);
  Tensor dv = Tensor::empty(s.v.shape(), prec_.compute);
  kernels::attention_backward(ctx, d_out, s.q, s.k, s.v, s.out, s.lse, mask_, scale, dq, dk, dv);
  d_out = Tensor();
  const Tensor dq3 = dq.reshape({t, h_, hd_}), dk3 = dk.reshape({t, hkv_, hd_});
  kernels::rope_backward(ctx, dq3, s.positions, theta_, dq3);
  kernels::rope_backward(ctx, dk3, s.positions, theta_, dk3);
  linear_backward(ctx, as_matrix(dq, h_ * hd_), s.x, wq_->value, wq_->grad, dx, 0.0f);
  linear_backward(ctx, as_matrix(dk, hkv_ * hd_), s.x, wk_->value, wk_->grad, dx, 1.0f);
  linear_backward(ctx, as_matrix(dv, hkv_ * hd_), s.x, wv_->value, wv_->grad, dx, 1.0f);
  release();
}

void SelfAttention::release() { saved_ = Saved{}; }

}  // namespace moetron::nn
