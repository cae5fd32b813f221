// GELU in double.
#include <cmath>

#include "moetron/kernels/gelu.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

namespace {
void check_same(const char* fn, const Tensor& a, const char* a_name, const Tensor& b,
                const char* b_name) {
  MOETRON_CHECK(is_floating(a.dtype()), fn, ": ", a_name, " must be a float tensor, got ", a.str());
  check_tensor(b, b_name, a.shape(), a.dtype());
}
double cdf(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
}
}  // namespace

void gelu_forward(Context&, const Tensor& x, const Tensor& y) {
  check_same("gelu_forward", x, "gelu x", y, "gelu y");
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = load(x, i);
    store(y, i, v * cdf(v));
  }
}

void gelu_backward(Context&, const Tensor& dy, const Tensor& x, const Tensor& dx) {
  check_same("gelu_backward", x, "gelu x", dy, "gelu dy");
  check_tensor(dx, "gelu dx", x.shape(), x.dtype());
  const double inv_sqrt_2pi = 1.0 / std::sqrt(2.0 * M_PI);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = load(x, i);
    store(dx, i, load(dy, i) * (cdf(v) + v * inv_sqrt_2pi * std::exp(-0.5 * v * v)));
  }
}

}  // namespace moetron::kernels::reference
