#include "moetron/kernels/activation.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void swiglu_forward(Context& ctx, const Tensor& gate_up, const Tensor& out) {
  if (needs_f16_staging(ctx, {&gate_up, &out})) {
    return run_f16_staged(ctx, "swiglu_forward", [&](F16Staging& s) {
      cpu::swiglu_forward(ctx, s.in(gate_up), s.out(out));
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, swiglu_forward, gate_up, out);
}
void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up,
                     const Tensor& d_gate_up) {
  if (needs_f16_staging(ctx, {&dout, &gate_up, &d_gate_up})) {
    return run_f16_staged(ctx, "swiglu_backward", [&](F16Staging& s) {
      cpu::swiglu_backward(ctx, s.in(dout), s.in(gate_up), s.out(d_gate_up));
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, swiglu_backward, dout, gate_up, d_gate_up);
}
void softmax_forward(Context& ctx, const Tensor& x, const Tensor& y) {
  if (needs_f16_staging(ctx, {&x, &y})) {
    return run_f16_staged(ctx, "softmax_forward",
                          [&](F16Staging& s) { cpu::softmax_forward(ctx, s.in(x), s.out(y)); });
  }
  MOETRON_KERNEL_DISPATCH(ctx, softmax_forward, x, y);
}
void softmax_backward(Context& ctx, const Tensor& dy, const Tensor& y, const Tensor& dx) {
  if (needs_f16_staging(ctx, {&dy, &y, &dx})) {
    return run_f16_staged(ctx, "softmax_backward", [&](F16Staging& s) {
      cpu::softmax_backward(ctx, s.in(dy), s.in(y), s.out(dx));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, softmax_backward, dy, y, dx);
}

}  // namespace moetron::kernels
