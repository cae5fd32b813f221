// SwiGLU and row softmax.
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// gate_up: [T, 2F], columns [0, F) the gate, [F, 2F) the up projection (one
// fused GEMM produces both); out: [T, F] = silu(gate) * up. f32 or bf16
// (reference also f64), all the same dtype.
MOETRON_KERNEL_DECL_CUDA(void swiglu_forward(Context& ctx, const Tensor& gate_up,
                                             const Tensor& out))
// d_gate_up: [T, 2F] overwritten.
MOETRON_KERNEL_DECL_CUDA(void swiglu_backward(Context& ctx, const Tensor& dout,
                                              const Tensor& gate_up, const Tensor& d_gate_up))

// Softmax over the last dimension of x: [R, C]; y: [R, C]. f32 or bf16 (bf16
// storage, f32 math; reference also f64), x and y the same dtype. Rows are
// shifted by their max first, so large logits do not overflow.
MOETRON_KERNEL_DECL(void softmax_forward(Context& ctx, const Tensor& x, const Tensor& y))
// dx = y * (dy - sum(dy * y)); dx overwritten, may alias dy; dy, y, dx the same dtype.
MOETRON_KERNEL_DECL(void softmax_backward(Context& ctx, const Tensor& dy, const Tensor& y,
                                          const Tensor& dx))

}  // namespace moetron::kernels
