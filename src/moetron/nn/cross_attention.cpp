#include "moetron/nn/cross_attention.h"

#include <cmath>
#include <type_traits>

#include "moetron/kernels/attention.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/norm.h"
#include "moetron/nn/linear.h"

namespace moetron::nn {

namespace {

constexpr int64_t kParallelElems = 16384;

// Host arithmetic of the gates, in double (the finite-difference checks of
// an f64 model need the gate exact), rounded once into the tensor's dtype.
template <typename Fn>
void with_element_type(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::bf16:
      return fn(bf16{});
    case DType::f16:
      return fn(f16{});
    default:
      MOETRON_FAIL("gated cross-attention takes f32, bf16, f16 or f64 activations, got ",
                   dtype_name(dt));
  }
}
inline double widen(float v) {
  return v;
}
inline double widen(double v) {
  return v;
}
inline double widen(bf16 v) {
  return bf16_to_f32(v.bits);
}
inline double widen(f16 v) {
  return f16_to_f32(v.bits);
}
template <typename T>
T narrow(double v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16{f32_to_bf16(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, f16>) {
    return f16{f32_to_f16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}

// y = x + g * u, elementwise (y may alias x).
void add_gated(const Tensor& x, double g, const Tensor& u, const Tensor& y) {
  with_element_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.data<T>(), *pu = u.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) py[i] = narrow<T>(widen(px[i]) + g * widen(pu[i]));
  });
}

// y = g * x.
void scaled(const Tensor& x, double g, const Tensor& y) {
  with_element_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) py[i] = narrow<T>(g * widen(px[i]));
  });
}

// sum_i a_i b_i in double, in element order (the same on any thread count).
double dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  with_element_type(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pa = a.data<T>(), *pb = b.data<T>();
    for (int64_t i = 0; i < a.numel(); ++i) sum += widen(pa[i]) * widen(pb[i]);
  });
  return sum;
}

double scalar(const Tensor& t) {
  return t.dtype() == DType::f64 ? t.data<double>()[0] : t.data<float>()[0];
}
void add_scalar(const Tensor& t, double v) {
  if (t.dtype() == DType::f64) {
    t.data<double>()[0] += v;
  } else {
    t.data<float>()[0] += static_cast<float>(v);
  }
}

}  // namespace

GatedCrossAttention::GatedCrossAttention(const ModelConfig& model, const std::string& prefix,
                                         Precision prec, ParameterSet& params)
    : d_(model.d_model),
      h_(model.n_heads),
      hkv_(model.n_kv_heads),
      hd_(model.resolved_head_dim()),
      eps_(static_cast<float>(model.norm_eps)),
      prec_(prec),
      norm1_(&params.add(prefix + "input_layernorm.weight", {model.d_model}, prec.accum, prec.accum,
                         ParallelKind::replicated, InitKind::ones, 0, false)),
      norm2_(nullptr),
      mlp_(
          model.d_model, model.ffn_hidden, prefix + "mlp.", static_cast<float>(model.init_std),
          static_cast<float>(model.init_std / std::sqrt(2.0 * static_cast<double>(model.n_layers))),
          prec, params) {
  MOETRON_CHECK(h_ > 0 && hkv_ > 0 && h_ % hkv_ == 0, prefix, ": n_heads ", h_,
                " must be a multiple of n_kv_heads ", hkv_);
  const auto std = static_cast<float>(model.init_std);
  const auto out_std =
      static_cast<float>(model.init_std / std::sqrt(2.0 * static_cast<double>(model.n_layers)));
  auto add = [&](const char* name, int64_t out, int64_t in, float s) {
    return &params.add(prefix + name, {out, in}, prec.compute, prec.matrix_grad(),
                       ParallelKind::replicated, InitKind::normal, s, true);
  };
  wq_ = add("q_proj.weight", h_ * hd_, d_, std);
  wk_ = add("k_proj.weight", hkv_ * hd_, d_, std);
  wv_ = add("v_proj.weight", hkv_ * hd_, d_, std);
  wo_ = add("o_proj.weight", d_, h_ * hd_, out_std);
  auto gate = [&](const char* name) {
    return &params.add(prefix + name, {1}, prec.accum, prec.accum, ParallelKind::replicated,
                       InitKind::zeros, 0, false);
  };
  attn_gate_ = gate("attn_gate");
  norm2_ = &params.add(prefix + "post_attention_layernorm.weight", {d_}, prec.accum, prec.accum,
                       ParallelKind::replicated, InitKind::ones, 0, false);
  mlp_gate_ = gate("mlp_gate");
}

void GatedCrossAttention::zero_items_without_media(const Activations& s, const Tensor& t) {
  for (int64_t b = 0; b < s.batch; ++b) {
    if (s.media_len[static_cast<size_t>(b)] == 0) t[b].fill(0.0);
  }
}

template <typename F>
void GatedCrossAttention::for_each_attention_run(const Activations& s, F f) {
  const int64_t m = s.media_tokens;
  for (int64_t b0 = 0; b0 < s.batch;) {
    const int64_t len = s.media_len[static_cast<size_t>(b0)];
    int64_t b1 = b0 + 1;
    if (len == m) {
      while (b1 < s.batch && s.media_len[static_cast<size_t>(b1)] == m) ++b1;
    }
    if (len > 0) f(b0, b1, len);
    b0 = b1;
  }
}

namespace {

// Rows [b0, b1) of a [B, L, ...] tensor with only their first `len` of L
// positions (one row, or len == L): a contiguous view [b1 - b0, len, ...].
Tensor row_prefix(const Tensor& t, int64_t b0, int64_t b1, int64_t len) {
  Shape shape = t.shape();
  shape[0] = b1 - b0;
  shape[1] = len;
  if (len == t.dim(1)) return t.slice(b0, b1);
  return t[b0].slice(0, len).reshape(shape);
}

kernels::AttentionMask non_causal() {
  kernels::AttentionMask mask;
  mask.causal = false;
  return mask;
}

}  // namespace

void GatedCrossAttention::attend(kernels::Context& ctx, Activations& s) const {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  // Rows that attend to nothing keep an output of 0.
  s.out = Tensor::zeros({s.batch, s.seq, h_, hd_}, prec_.compute);
  s.lse = Tensor::zeros({s.batch, h_, s.seq}, prec_.accum);
  for_each_attention_run(s, [&](int64_t b0, int64_t b1, int64_t len) {
    kernels::attention_forward(ctx, s.q.slice(b0, b1), row_prefix(s.k, b0, b1, len),
                               row_prefix(s.v, b0, b1, len), non_causal(), scale,
                               s.out.slice(b0, b1), s.lse.slice(b0, b1));
  });
}

void GatedCrossAttention::attend_backward(kernels::Context& ctx, const Activations& s,
                                          const Tensor& d_attn, const Tensor& dq, const Tensor& dk,
                                          const Tensor& dv) const {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  for_each_attention_run(s, [&](int64_t b0, int64_t b1, int64_t len) {
    kernels::attention_backward(
        ctx, d_attn.slice(b0, b1), s.q.slice(b0, b1), row_prefix(s.k, b0, b1, len),
        row_prefix(s.v, b0, b1, len), s.out.slice(b0, b1), s.lse.slice(b0, b1), non_causal(), scale,
        dq.slice(b0, b1), row_prefix(dk, b0, b1, len), row_prefix(dv, b0, b1, len));
  });
}

Tensor GatedCrossAttention::forward(kernels::Context& ctx, const Tensor& x, const Tensor& media,
                                    int64_t batch, int64_t seq,
                                    const std::vector<int64_t>& media_len) {
  const int64_t t = batch * seq;
  check_tensor(x, "cross-attention input", {t, d_}, prec_.compute);
  MOETRON_CHECK(batch > 0, "cross-attention of ", batch, " rows");
  MOETRON_CHECK(ctx.backend() != kernels::Backend::cuda,
                "gated cross-attention applies its gates on the host: cpu and reference backends");
  MOETRON_CHECK(!media.defined() || (media.rank() == 2 && media.dim(1) == d_ &&
                                     media.dim(0) % batch == 0 && media.dtype() == prec_.compute),
                "cross-attention media must be ", dtype_name(prec_.compute), " [B * M, ", d_,
                "] with B = ", batch, ", got ", media.str());
  Activations s;
  s.x = x;
  s.media = media;
  s.batch = batch;
  s.seq = seq;
  s.media_tokens = media.defined() ? media.dim(0) / batch : 0;
  const int64_t m = s.media_tokens;
  MOETRON_CHECK(media_len.empty() || static_cast<int64_t>(media_len.size()) == batch,
                "cross-attention: ", media_len.size(), " media lengths for ", batch, " rows");
  s.media_len = media_len.empty() ? std::vector<int64_t>(static_cast<size_t>(batch), m) : media_len;
  for (int64_t len : s.media_len)
    MOETRON_CHECK(len >= 0 && len <= m, "cross-attention: a row of ", len, " media tokens in ", m,
                  " slots");
  s.rstd1 = Tensor::empty({t}, prec_.accum);
  s.n1 = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, norm1_->value, eps_, s.n1, s.rstd1);
  s.u = Tensor::zeros({t, d_}, prec_.compute);
  if (m > 0) {  // else no row attends: u stays 0
    s.q = Tensor::empty({batch, seq, h_, hd_}, prec_.compute);
    s.k = Tensor::empty({batch, m, hkv_, hd_}, prec_.compute);
    s.v = Tensor::empty({batch, m, hkv_, hd_}, prec_.compute);
    linear_forward(ctx, s.n1, wq_->value, as_matrix(s.q, h_ * hd_));
    linear_forward(ctx, media, wk_->value, as_matrix(s.k, hkv_ * hd_));
    linear_forward(ctx, media, wv_->value, as_matrix(s.v, hkv_ * hd_));
    attend(ctx, s);
    linear_forward(ctx, as_matrix(s.out, h_ * hd_), wo_->value, s.u);
  }
  s.y = Tensor::empty({t, d_}, prec_.compute);
  add_gated(x, std::tanh(scalar(attn_gate_->value)), s.u, s.y);
  s.rstd2 = Tensor::empty({t}, prec_.accum);
  Tensor n2 = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_forward(ctx, s.y, norm2_->value, eps_, n2, s.rstd2);
  s.m = Tensor::empty({t, d_}, prec_.compute);
  mlp_.forward(ctx, n2, s.m);
  Tensor out = Tensor::empty({t, d_}, prec_.compute);
  add_gated(s.y, std::tanh(scalar(mlp_gate_->value)), s.m, out);
  saved_ = std::move(s);
  return out;
}

Tensor GatedCrossAttention::backward(kernels::Context& ctx, const Tensor& d_out,
                                     const Tensor& d_media) {
  Activations& s = saved_;
  MOETRON_CHECK(s.x.defined(), "cross-attention backward without a saved forward");
  const int64_t t = s.batch * s.seq;
  check_shape(d_out, "cross-attention d_out", {t, d_});
  // out = y + tanh(f) m: d tanh(f) = sum(d_out * m), d m = tanh(f) d_out.
  const double gf = std::tanh(scalar(mlp_gate_->value));
  add_scalar(mlp_gate_->grad, dot(d_out, s.m) * (1.0 - gf * gf));
  Tensor d_m = Tensor::empty({t, d_}, prec_.compute);
  scaled(d_out, gf, d_m);
  Tensor d_n2 = Tensor::empty({t, d_}, prec_.compute);
  mlp_.backward(ctx, d_m, d_n2);
  Tensor d_y = std::move(d_m);  // same shape: reuse the buffer
  kernels::rmsnorm_backward(ctx, d_n2, s.y, norm2_->value, s.rstd2, d_y, norm2_->grad);
  kernels::add(ctx, d_y, d_out, d_y);
  // y = x + tanh(a) u.
  const double ga = std::tanh(scalar(attn_gate_->value));
  add_scalar(attn_gate_->grad, dot(d_y, s.u) * (1.0 - ga * ga));
  if (s.media_tokens == 0) {  // no attention ran: x reached y unchanged
    release();
    return d_y;
  }
  Tensor d_u = std::move(d_n2);
  scaled(d_y, ga, d_u);
  Tensor d_attn = Tensor::empty(s.out.shape(), prec_.compute);
  linear_backward(ctx, d_u, as_matrix(s.out, h_ * hd_), wo_->value, wo_->grad,
                  as_matrix(d_attn, h_ * hd_));
  zero_items_without_media(s, d_attn);  // those rows attended to nothing
  // Rows and slots no attention call covers keep a gradient of 0.
  Tensor dq = Tensor::zeros(s.q.shape(), prec_.compute);
  Tensor dk = Tensor::zeros(s.k.shape(), prec_.compute);
  Tensor dv = Tensor::zeros(s.v.shape(), prec_.compute);
  attend_backward(ctx, s, d_attn, dq, dk, dv);
  Tensor d_n1 = std::move(d_u);
  linear_backward(ctx, as_matrix(dq, h_ * hd_), s.n1, wq_->value, wq_->grad, d_n1);
  Tensor dx = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_backward(ctx, d_n1, s.x, norm1_->value, s.rstd1, dx, norm1_->grad);
  kernels::add(ctx, dx, d_y, dx);
  if (d_media.defined()) check_shape(d_media, "cross-attention d_media", s.media.shape());
  linear_backward(ctx, as_matrix(dk, hkv_ * hd_), s.media, wk_->value, wk_->grad, d_media, 1.0f);
  linear_backward(ctx, as_matrix(dv, hkv_ * hd_), s.media, wv_->value, wv_->grad, d_media, 1.0f);
  release();
  return dx;
}

void GatedCrossAttention::release() {
  saved_ = Activations{};
  mlp_.release();
}

}  // namespace moetron::nn
