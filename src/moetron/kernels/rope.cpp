#include "moetron/kernels/rope.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void rope_forward(Context& ctx, const Tensor& x, const Tensor& positions, float theta,
                  const Tensor& y) {
  if (needs_f16_staging(ctx, {&x, &y})) {
    return run_f16_staged(ctx, "rope_forward", [&](F16Staging& s) {
      cpu::rope_forward(ctx, s.in(x), positions, theta, s.out(y));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, rope_forward, x, positions, theta, y);
}
void rope_backward(Context& ctx, const Tensor& dy, const Tensor& positions, float theta,
                   const Tensor& dx) {
  if (needs_f16_staging(ctx, {&dy, &dx})) {
    return run_f16_staged(ctx, "rope_backward", [&](F16Staging& s) {
      cpu::rope_backward(ctx, s.in(dy), positions, theta, s.out(dx));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, rope_backward, dy, positions, theta, dx);
}

}  // namespace moetron::kernels
