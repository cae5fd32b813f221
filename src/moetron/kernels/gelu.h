// GELU, exact (erf) form: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)),
// the activation of the encoders' convolutions and of the projector
// (Whisper, LLaVA-1.5). d gelu / dx = Phi(x) + x phi(x).
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// x, y: same shape and float dtype (f32, bf16 or f16; reference also f64);
// y may alias x. f32 math on the CPU.
MOETRON_KERNEL_DECL(void gelu_forward(Context& ctx, const Tensor& x, const Tensor& y))
// dx = dy * gelu'(x); dx may alias dy. dy, x, dx: same shape and dtype.
MOETRON_KERNEL_DECL(void gelu_backward(Context& ctx, const Tensor& dy, const Tensor& x,
                                       const Tensor& dx))

}  // namespace moetron::kernels
