#include "moetron/kernels/norm.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  if (needs_f16_staging(ctx, {&x, &y})) {
    return run_f16_staged(ctx, "rmsnorm_forward", [&](F16Staging& s) {
      cpu::rmsnorm_forward(ctx, s.in(x), w, eps, s.out(y), rstd);
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, rmsnorm_forward, x, w, eps, y, rstd);
}
void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  if (needs_f16_staging(ctx, {&dy, &x, &dx})) {
    return run_f16_staged(ctx, "rmsnorm_backward", [&](F16Staging& s) {
      cpu::rmsnorm_backward(ctx, s.in(dy), s.in(x), w, rstd, s.out(dx), dw);
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, rmsnorm_backward, dy, x, w, rstd, dx, dw);
}

Scratch rmsnorm_backward_scratch(Backend backend, int64_t rows, int64_t cols, DType dtype) {
  const int64_t n = rows * cols;  // dy, x and dx
  return call_scratch("rmsnorm_backward_scratch", backend, dtype == DType::f16, {n, n, n},
                      [&] { return cpu::rmsnorm_backward_scratch(rows, cols); });
}

}  // namespace moetron::kernels
