#include "moetron/kernels/activation.h"

namespace moetron::kernels {

void swiglu_forward(Context& ctx, const Tensor& gate_up, const Tensor& out) {
  MOETRON_KERNEL_DISPATCH(ctx, swiglu_forward, gate_up, out);
}
void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up,
                     const Tensor& d_gate_up) {
  MOETRON_KERNEL_DISPATCH(ctx, swiglu_backward, dout, gate_up, d_gate_up);
}
void softmax_forward(Context& ctx, const Tensor& x, const Tensor& y) {
  MOETRON_KERNEL_DISPATCH(ctx, softmax_forward, x, y);
}
void softmax_backward(Context& ctx, const Tensor& dy, const Tensor& y, const Tensor& dx) {
  MOETRON_KERNEL_DISPATCH(ctx, softmax_backward, dy, y, dx);
}

}  // namespace moetron::kernels
