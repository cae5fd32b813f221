// GELU on the CPU: f32 math (std::erf, std::exp) per element, OpenMP over
// the elements of large tensors.
#include <cmath>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/gelu.h"

namespace moetron::kernels::cpu {

namespace {
constexpr int64_t kParallelElems = 16384;

void check_same(const char* fn, const Tensor& a, const char* a_name, const Tensor& b,
                const char* b_name) {
  MOETRON_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::bf16 || a.dtype() == DType::f16, fn,
                ": the CPU backend takes an f32, bf16 or f16 ", a_name, ", got ", a.str());
  check_tensor(b, b_name, a.shape(), a.dtype());
}
}  // namespace

void gelu_forward(Context&, const Tensor& x, const Tensor& y) {
  check_same("gelu_forward", x, "gelu x", y, "gelu y");
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using S = decltype(tag);
    const S* px = ptr<S>(x);
    S* py = ptr<S>(y);
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(px[i]);
      py[i] = from_f32<S>(0.5f * v * (1.0f + std::erf(v * 0.70710678f)));
    }
  });
}

void gelu_backward(Context&, const Tensor& dy, const Tensor& x, const Tensor& dx) {
  check_same("gelu_backward", x, "gelu x", dy, "gelu dy");
  check_tensor(dx, "gelu dx", x.shape(), x.dtype());
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using S = decltype(tag);
    const S* px = ptr<S>(x);
    const S* pdy = ptr<S>(dy);
    S* pdx = ptr<S>(dx);
#pragma omp parallel for schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(px[i]);
      const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678f));
      const float pdf = 0.39894228f * std::exp(-0.5f * v * v);
      pdx[i] = from_f32<S>(to_f32(pdy[i]) * (cdf + v * pdf));
    }
  });
}

}  // namespace moetron::kernels::cpu
