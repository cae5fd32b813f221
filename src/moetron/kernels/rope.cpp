#include "moetron/kernels/rope.h"

namespace moetron::kernels {

void rope_forward(Context& ctx, const Tensor& x, const Tensor& positions, float theta,
                  const Tensor& y) {
  MOETRON_KERNEL_DISPATCH(ctx, rope_forward, x, positions, theta, y);
}
void rope_backward(Context& ctx, const Tensor& dy, const Tensor& positions, float theta,
                   const Tensor& dx) {
  MOETRON_KERNEL_DISPATCH(ctx, rope_backward, dy, positions, theta, dx);
}

}  // namespace moetron::kernels
