// CPU cross-entropy. One row of logits is handled by one thread in a fixed
// order (max, sum of exp, gradient), so the losses and dlogits do not depend
// on the thread count; the fused version's GEMMs are the CPU matmul kernel.

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/row_io.h"
#include "moetron/kernels/cpu/vec_math.h"
#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/cross_entropy_checks.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"

namespace moetron::kernels::cpu {

using ce_detail::describe;
using row_io::load16;
using row_io::load16_or;
using row_io::store16;

namespace {

// Rows per parallel region worth waking the pool for (V ~ 1e4 per row).
constexpr int64_t kParallelElements = 16384;

// Backward GEMMs for bf16 hidden/head_w (matmul needs both inputs in one
// dtype). Three schemes were measured at T 4096, V 8192, D 512, chunk 512,
// 1 Zen 5 core, and checked for accuracy against the fp64 reference at
// T 256, V 2048, D 128 (normalised max error):
//   all bf16 (dlogits rounded for both GEMMs):  ~0.41 s, d_head_w err 1.9e-3
//   mixed (used here):                          ~0.50 s, d_head_w err 6e-7
//   all f32 (f32 copies of head_w and hidden):  ~0.62 s, d_head_w err 6e-7
// Mixed: d_hidden = bf16(dlogits) head_w in bf16, since d_hidden is stored
// in bf16 anyway (its error is 3.9e-3 vs 2.2e-3 from the final rounding
// alone); d_head_w += dlogits^T f32(hidden chunk) in f32, because d_head_w is
// the f32 gradient of a master weight and accumulates over micro-batches,
// where a 2^-9 relative error per dlogit (8 significant bits) is not worth
// the ~20% saved on this kernel (~2% of a bench-moe training step).

void check_cpu_float(const Tensor& t, const char* fn, const char* name) {
  MOETRON_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, fn, ": ", name,
                " must be f32 or bf16 on the CPU backend, got ", t.str());
}
void check_f32(const Tensor& t, const char* fn, const char* name) {
  MOETRON_CHECK(!t.defined() || t.dtype() == DType::f32, fn, ": ", name,
                " must be f32 on the CPU backend, got ", describe(t));
}

// Loss of one row x[0, V) (returned) and, when dl is not null, the gradient
// grad_scale (softmax(x) - onehot(target)) written into dl[0, V) (dl may be
// x itself: every 16-lane block is read before it is written), and also
// rounded into dl_bf16[0, V) when that is not null.
template <typename TX, typename TG>
float xent_row(const TX* x, int64_t V, int32_t target, float grad_scale, TG* dl, bf16* dl_bf16) {
  if (target < 0) {
    for (int64_t v = 0; v < V && dl; v += 16) store16(dl + v, simd::zero(), V - v);
    for (int64_t v = 0; v < V && dl_bf16; v += 16) store16(dl_bf16 + v, simd::zero(), V - v);
    return 0.0f;
  }
  const simd::vf neg_inf = simd::set1(-std::numeric_limits<float>::infinity());
  simd::vf mx = neg_inf;
  for (int64_t v = 0; v < V; v += 16) mx = simd::max(mx, load16_or(x + v, V - v, neg_inf));
  const float m = simd::reduce_max(mx);
  const simd::vf mv = simd::set1(m);
  simd::vf sum = simd::zero();
  for (int64_t v = 0; v < V; v += 16) {
    // Lanes past V read -inf, whose exp is 0.
    sum = simd::add(sum, exp16(simd::sub(load16_or(x + v, V - v, neg_inf), mv)));
  }
  const float s = simd::reduce_add(sum);
  const float x_target = to_f32(x[target]);
  const float loss = m + std::log(s) - x_target;
  if (dl) {
    const simd::vf coef = simd::set1(grad_scale / s);
    const simd::vf scale = simd::set1(grad_scale);
    for (int64_t v = 0; v < V; v += 16) {
      simd::vf g = simd::mul(exp16(simd::sub(load16(x + v, V - v), mv)), coef);
      if (target >= v && target < v + 16) {
        g = simd::blend(static_cast<simd::mask16>(1u << (target - v)), g, simd::sub(g, scale));
      }
      store16(dl + v, g, V - v);
      if (dl_bf16) store16(dl_bf16 + v, g, V - v);
    }
  }
  return loss;
}

template <typename TX, typename TG>
void xent_rows(const TX* x, int64_t rows, int64_t V, const int32_t* targets, float grad_scale,
               float* losses, TG* dl, bf16* dl_bf16 = nullptr) {
#pragma omp parallel for schedule(static) if (rows * V > kParallelElements)
  for (int64_t t = 0; t < rows; ++t) {
    losses[t] = xent_row(x + t * V, V, targets[t], grad_scale, dl ? dl + t * V : nullptr,
                         dl_bf16 ? dl_bf16 + t * V : nullptr);
  }
}

}  // namespace

void cross_entropy(Context&, const Tensor& logits, const Tensor& targets, float grad_scale,
                   const Tensor& losses, const Tensor& dlogits) {
  const char* fn = "cross_entropy";
  ce_detail::check_logits(fn, logits, dlogits);
  check_cpu_float(logits, fn, "logits");
  check_f32(losses, fn, "losses");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  ce_detail::check_targets(fn, targets, losses, T, V);
  const int32_t* tg = ptr<int32_t>(targets);
  float* pl = ptr<float>(losses);
  if (logits.dtype() == DType::f32) {
    xent_rows(ptr<float>(logits), T, V, tg, grad_scale, pl,
              dlogits.defined() ? ptr<float>(dlogits) : nullptr);
  } else {
    xent_rows(ptr<bf16>(logits), T, V, tg, grad_scale, pl,
              dlogits.defined() ? ptr<bf16>(dlogits) : nullptr);
  }
}

Scratch cross_entropy_fused_scratch(const CrossEntropyFusedShape& s) {
  MOETRON_CHECK(s.tokens >= 0 && s.vocab >= 0 && s.dim >= 0 && s.chunk_tokens >= 1,
                "cross_entropy_fused_scratch: bad shape T ", s.tokens, " V ", s.vocab, " D ", s.dim,
                " chunk ", s.chunk_tokens);
  if (s.tokens == 0) return {};  // the kernel returns before allocating
  const bool is_bf16 = s.dtype == DType::bf16;
  const int64_t C = std::min(s.chunk_tokens, s.tokens);
  Scratch out;
  add_scratch(out, C * s.vocab, DType::f32);
  if (is_bf16 && s.d_hidden) add_scratch(out, C * s.vocab, DType::bf16);
  if (is_bf16 && s.d_head_w) add_scratch(out, C * s.dim, DType::f32);
  return out;
}

void cross_entropy_fused(Context& ctx, const Tensor& hidden, const Tensor& head_w,
                         const Tensor& targets, float grad_scale, int64_t chunk_tokens,
                         const Tensor& losses, const Tensor& d_hidden, const Tensor& d_head_w) {
  const char* fn = "cross_entropy_fused";
  ce_detail::check_fused(fn, hidden, head_w, chunk_tokens, d_hidden, d_head_w);
  check_cpu_float(hidden, fn, "hidden");
  check_f32(losses, fn, "losses");
  check_f32(d_head_w, fn, "d_head_w");
  const int64_t T = hidden.dim(0), V = head_w.dim(0);
  ce_detail::check_targets(fn, targets, losses, T, V);
  if (T == 0) return;
  const bool grad = d_hidden.defined() || d_head_w.defined();
  const bool is_bf16 = hidden.dtype() == DType::bf16;
  const int64_t C = std::min(chunk_tokens, T);
  // The only [*, V] buffers: one chunk of fp32 logits, overwritten in place
  // by the fp32 dlogits, and for bf16 d_hidden one chunk of bf16 dlogits.
  Tensor logits = Tensor::empty({C, V}, DType::f32, MemTag::workspace);
  Tensor dlogits_bf16 = is_bf16 && d_hidden.defined()
                            ? Tensor::empty({C, V}, DType::bf16, MemTag::workspace)
                            : Tensor();
  Tensor hidden_f32 = is_bf16 && d_head_w.defined()
                          ? Tensor::empty({C, hidden.dim(1)}, DType::f32, MemTag::workspace)
                          : Tensor();
  const int32_t* tg = ptr<int32_t>(targets);
  float* pl = ptr<float>(losses);
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int64_t n = std::min(C, T - t0);
    const Tensor h = hidden.slice(t0, t0 + n);
    const Tensor z = logits.slice(0, n);
    cpu::matmul(ctx, h, head_w, z, {.trans_b = true});
    if (!grad) {
      xent_rows(ptr<float>(z), n, V, tg + t0, grad_scale, pl + t0, static_cast<float*>(nullptr));
      continue;
    }
    const Tensor zb = dlogits_bf16.defined() ? dlogits_bf16.slice(0, n) : Tensor();
    xent_rows(ptr<float>(z), n, V, tg + t0, grad_scale, pl + t0, ptr<float>(z),
              zb.defined() ? ptr<bf16>(zb) : nullptr);
    // d_hidden rows = dlogits head_w; d_head_w += dlogits^T hidden rows.
    if (d_hidden.defined()) {
      cpu::matmul(ctx, is_bf16 ? zb : z, head_w, d_hidden.slice(t0, t0 + n), {});
    }
    if (d_head_w.defined()) {
      Tensor h32 = h;
      if (is_bf16) {
        h32 = hidden_f32.slice(0, n);
        cpu::convert(ctx, h, h32);
      }
      cpu::matmul(ctx, z, h32, d_head_w, {.trans_a = true, .beta = 1.0f});
    }
  }
}

}  // namespace moetron::kernels::cpu
