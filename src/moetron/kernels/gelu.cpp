#include "moetron/kernels/gelu.h"

namespace moetron::kernels {

void gelu_forward(Context& ctx, const Tensor& x, const Tensor& y) {
  MOETRON_KERNEL_DISPATCH(ctx, gelu_forward, x, y);
}
void gelu_backward(Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& dx) {
  MOETRON_KERNEL_DISPATCH(ctx, gelu_backward, dy, x, dx);
}

}  // namespace moetron::kernels
