// SwiGLU and row softmax on the CPU: OpenMP over rows, AVX-512 along a row
// with exp512 from vec_math.h, f32 math for f32 and bf16 storage.
#include "moetron/kernels/activation.h"

#include <omp.h>

#include <type_traits>

#include "moetron/kernels/activation_checks.h"
#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"

namespace moetron::kernels::cpu {

namespace {

constexpr int64_t kParallelElems = 16384;

// sigmoid(g) = 1 / (1 + exp(-g)); exp512 saturates to +inf for g < -88.8,
// giving sigmoid 0 and silu -0, as in exact arithmetic.
inline simd::vf sigmoid16(simd::vf g) {
  const simd::vf one = simd::set1(1.0f);
  return simd::div(one, simd::add(one, exp16(simd::sub(simd::zero(), g))));
}

void check_softmax(const char* fn, const Tensor& a, const char* a_name, const Tensor& b,
                   const char* b_name) {
  MOETRON_CHECK(a.rank() == 2, fn, ": ", a_name, " must be [R, C], got ", a.str());
  check_tensor(b, b_name, a.shape(), a.dtype());
}

}  // namespace

void swiglu_forward(Context&, const Tensor& gate_up, const Tensor& out) {
  const int64_t F = activation_detail::check_swiglu("swiglu_forward", gate_up, out, "swiglu out");
  const int64_t T = gate_up.dim(0);
  dispatch_f32_bf16(gate_up.dtype(), "swiglu_forward", [&](auto tag) {
    using S = decltype(tag);
    const S* pgu = ptr<S>(gate_up);
    S* po = ptr<S>(out);
#pragma omp parallel for schedule(static) firstprivate(F, pgu, po) if (T * F > kParallelElems)
    for (int64_t t = 0; t < T; ++t) {
      const S* g = pgu + t * 2 * F;
      const S* u = g + F;
      S* o = po + t * F;
      for (int64_t j = 0; j < F; j += 16) {
        const simd::mask16 m = lane_mask(F - j);
        const simd::vf gv = load16(g + j, m);
        const simd::vf silu = simd::mul(gv, sigmoid16(gv));
        store16(o + j, simd::mul(silu, load16(u + j, m)), m);
      }
    }
  });
}

void swiglu_backward(Context&, const Tensor& dout, const Tensor& gate_up, const Tensor& d_gate_up) {
  const int64_t F =
      activation_detail::check_swiglu("swiglu_backward", gate_up, dout, "swiglu dout");
  check_tensor(d_gate_up, "swiglu d_gate_up", gate_up.shape(), gate_up.dtype());
  const int64_t T = gate_up.dim(0);
  dispatch_f32_bf16(gate_up.dtype(), "swiglu_backward", [&](auto tag) {
    using S = decltype(tag);
    const S* pgu = ptr<S>(gate_up);
    const S* pd = ptr<S>(dout);
    S* pdgu = ptr<S>(d_gate_up);
#pragma omp parallel for schedule(static) firstprivate(F, pgu, pd, pdgu) if (T * F > kParallelElems)
    for (int64_t t = 0; t < T; ++t) {
      const S* g = pgu + t * 2 * F;
      const S* u = g + F;
      const S* d = pd + t * F;
      S* dg = pdgu + t * 2 * F;
      S* du = dg + F;
      const simd::vf one = simd::set1(1.0f);
      for (int64_t j = 0; j < F; j += 16) {
        const simd::mask16 m = lane_mask(F - j);
        const simd::vf gv = load16(g + j, m), uv = load16(u + j, m), dv = load16(d + j, m);
        const simd::vf s = sigmoid16(gv);
        const simd::vf silu = simd::mul(gv, s);
        // d silu / dg = s * (1 + g * (1 - s)) = s + silu * (1 - s)
        const simd::vf dsilu = simd::fmadd(silu, simd::sub(one, s), s);
        store16(dg + j, simd::mul(simd::mul(dv, uv), dsilu), m);
        store16(du + j, simd::mul(dv, silu), m);
      }
    }
  });
}

void softmax_forward(Context&, const Tensor& x, const Tensor& y) {
  check_softmax("softmax_forward", x, "softmax x", y, "softmax y");
  const int64_t R = x.dim(0), C = x.dim(1);
  // exp(x - max) is kept in f32 until the row sum is known: in y itself for
  // f32 (the row stays in L1), in a per-thread f32 row for bf16, so every
  // element costs one exp and y is rounded only once.
  const bool need_scratch = x.dtype() != DType::f32;
  Tensor scratch = need_scratch
                       ? Tensor::empty({omp_get_max_threads(), C}, DType::f32, MemTag::workspace)
                       : Tensor();
  float* pscratch = need_scratch ? ptr<float>(scratch) : nullptr;
  dispatch_f32_bf16(x.dtype(), "softmax_forward", [&](auto tag) {
    using S = decltype(tag);
    const S* px = ptr<S>(x);
    S* py = ptr<S>(y);
#pragma omp parallel for schedule(static) \
    firstprivate(C, px, py, pscratch) if (R * C > kParallelElems)
    for (int64_t r = 0; r < R; ++r) {
      const S* xr = px + r * C;
      S* yr = py + r * C;
      float* er;
      if constexpr (std::is_same_v<S, float>) {
        er = yr;
      } else {
        er = pscratch + omp_get_thread_num() * C;
      }
      simd::vf mx = simd::set1(-__builtin_inff());
      for (int64_t c = 0; c < C; c += 16) {
        const simd::mask16 m = lane_mask(C - c);
        mx = simd::blend(m, mx, simd::max(mx, load16(xr + c, m)));
      }
      const simd::vf mv = simd::set1(simd::reduce_max(mx));
      simd::vf sum = simd::zero();
      for (int64_t c = 0; c < C; c += 16) {
        const simd::mask16 m = lane_mask(C - c);
        const simd::vf e = exp16(simd::sub(load16(xr + c, m), mv));
        sum = simd::blend(m, sum, simd::add(sum, e));
        store16(er + c, e, m);
      }
      const simd::vf inv = simd::set1(1.0f / simd::reduce_add(sum));
      for (int64_t c = 0; c < C; c += 16) {
        const simd::mask16 m = lane_mask(C - c);
        store16(yr + c, simd::mul(load16(er + c, m), inv), m);
      }
    }
  });
}

void softmax_backward(Context&, const Tensor& dy, const Tensor& y, const Tensor& dx) {
  check_softmax("softmax_backward", y, "softmax y", dy, "softmax dy");
  check_tensor(dx, "softmax dx", y.shape(), y.dtype());
  const int64_t R = y.dim(0), C = y.dim(1);
  dispatch_f32_bf16(y.dtype(), "softmax_backward", [&](auto tag) {
    using S = decltype(tag);
    const S* pdy = ptr<S>(dy);
    const S* py = ptr<S>(y);
    S* pdx = ptr<S>(dx);
#pragma omp parallel for schedule(static) firstprivate(C, pdy, py, pdx) if (R * C > kParallelElems)
    for (int64_t r = 0; r < R; ++r) {
      const S* g = pdy + r * C;
      const S* yr = py + r * C;
      S* o = pdx + r * C;
      simd::vf dot = simd::zero();
      for (int64_t c = 0; c < C; c += 16) {
        const simd::mask16 m = lane_mask(C - c);
        dot = simd::fmadd(load16(g + c, m), load16(yr + c, m), dot);
      }
      const simd::vf dv = simd::set1(simd::reduce_add(dot));
      // The whole row's dot is known before dx is written, so dx may alias dy.
      for (int64_t c = 0; c < C; c += 16) {
        const simd::mask16 m = lane_mask(C - c);
        const simd::vf yv = load16(yr + c, m);
        store16(o + c, simd::mul(yv, simd::sub(load16(g + c, m), dv)), m);
      }
    }
  });
}

}  // namespace moetron::kernels::cpu
