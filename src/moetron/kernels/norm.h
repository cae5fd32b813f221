// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w over the last dimension.
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"
#include "moetron/kernels/workspace.h"

namespace moetron::kernels {

// x, y: [T, D] f32 or bf16 (same dtype; reference also f64); w: [D] f32 (or f64);
// rstd: [T] f32 (or f64), 1 / sqrt(mean(x^2) + eps), saved for backward.
MOETRON_KERNEL_DECL_CUDA(void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w,
                                              float eps, const Tensor& y, const Tensor& rstd))
// dx: [T, D] overwritten (dtype of x); dw: [D] f32 accumulated (dw += ...).
MOETRON_KERNEL_DECL_CUDA(void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& x,
                                               const Tensor& w, const Tensor& rstd,
                                               const Tensor& dx, const Tensor& dw))

// The workspace rmsnorm_backward on `backend` allocates for x of [rows, cols]
// in `dtype` (kernels/workspace.h): on the CPU one f32 dw partial per chunk
// of rows, after, for f16, the staged copies of dy, x and dx; nothing on
// the reference.
Scratch rmsnorm_backward_scratch(Backend backend, int64_t rows, int64_t cols, DType dtype);
namespace cpu {
Scratch rmsnorm_backward_scratch(int64_t rows, int64_t cols);
}  // namespace cpu

}  // namespace moetron::kernels
