// Rotary position embedding, "rotate half" (non-interleaved) layout of
// Hugging Face Llama/Mixtral: for i < hd/2, the pair (x_i, x_{i+hd/2}) at
// position p is rotated by angle p * theta^(-2i/hd).
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// x, y: [T, H, hd] (hd even) f32 or bf16 (reference also f64); positions: i32 [T].
// y may alias x. Angles are computed in fp32 (fp64 in the reference).
MOETRON_KERNEL_DECL(void rope_forward(Context& ctx, const Tensor& x, const Tensor& positions,
                                      float theta, const Tensor& y))
// The inverse rotation applied to dy; dx may alias dy.
MOETRON_KERNEL_DECL(void rope_backward(Context& ctx, const Tensor& dy, const Tensor& positions,
                                       float theta, const Tensor& dx))

}  // namespace moetron::kernels
