// The GEMMs of a Linear layer with weights stored [out, in] (Hugging Face
// layout), written once so every module's forward and backward read alike.
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"

namespace moetron::nn {

// y = x W^T (+ beta * y). x: [T, in], w: [out, in], y: [T, out].
void linear_forward(kernels::Context& ctx, const Tensor& x, const Tensor& w, const Tensor& y,
                    float beta = 0.0f);
// dW += dy^T x (always accumulates: gradients of micro-batches add up), and
// dx = dy W + dx_beta * dx when dx is defined.
void linear_backward(kernels::Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                     const Tensor& dw, const Tensor& dx, float dx_beta = 0.0f);

// 2-D view [rows, cols] of a tensor whose elements are rows x cols.
Tensor as_matrix(const Tensor& t, int64_t cols);

}  // namespace moetron::nn
