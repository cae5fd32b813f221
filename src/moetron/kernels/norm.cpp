#include "moetron/kernels/norm.h"

namespace moetron::kernels {

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  MOETRON_KERNEL_DISPATCH(ctx, rmsnorm_forward, x, w, eps, y, rstd);
}
void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  MOETRON_KERNEL_DISPATCH(ctx, rmsnorm_backward, dy, x, w, rstd, dx, dw);
}

}  // namespace moetron::kernels
