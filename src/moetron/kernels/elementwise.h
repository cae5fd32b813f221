// Elementwise arithmetic, dtype conversion and reductions.
// Shapes must have equal element counts; outputs may alias inputs.
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// out = a + b. a, b, out: same float dtype (f32, bf16, f16, f64).
MOETRON_KERNEL_DECL(void add(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& out))
// out = alpha * x. Same float dtype.
MOETRON_KERNEL_DECL(void scale(Context& ctx, const Tensor& x, float alpha, const Tensor& out))
// y += alpha * x. x any float dtype; y f32 or f64 (or x's dtype).
MOETRON_KERNEL_DECL(void axpy(Context& ctx, float alpha, const Tensor& x, const Tensor& y))
// dst = src converted to dst's dtype, rounding to nearest even (any float dtypes).
MOETRON_KERNEL_DECL(void convert(Context& ctx, const Tensor& src, const Tensor& dst))
// sum of x_i^2, accumulated in double.
MOETRON_KERNEL_DECL(double sum_squares(Context& ctx, const Tensor& x))
// sum of (a_i - b_i)^2, differences and sum in double; a, b: same float
// dtype. Reads both once and writes nothing: a parameter update's norm
// without a difference tensor (nor its rounding to a 16-bit dtype).
MOETRON_KERNEL_DECL(double sum_squared_difference(Context& ctx, const Tensor& a, const Tensor& b))

}  // namespace moetron::kernels
