// 1-D convolution over the time axis, channels last (the audio encoder's
// two convolutions over log-mel frames, Whisper-style):
//   y[b, t, o] = bias[o] + sum_{c, k} w[o, c, k] x[b, t * stride - padding + k, c]
// (positions outside [0, L) read zero), with L_out = (L + 2 padding - K) / stride + 1.
// The CPU backend lowers it to GEMMs on im2col rows [B * L_out, C_in * K]
// (column c * K + k, so w is the GEMM's [C_out, C_in * K] matrix as stored).
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

struct Conv1dArgs {
  int64_t stride = 1;
  int64_t padding = 0;  // zeros on both ends
};

// The output length of a convolution of width `kernel` over `length`
// positions (throws when the padded input is shorter than the kernel).
int64_t conv1d_output_length(int64_t length, int64_t kernel, const Conv1dArgs& args);

// x: [B, L, C_in]; w: [C_out, C_in, K] (PyTorch's layout); bias: [C_out];
// y: [B, L_out, C_out] overwritten. x, w, bias, y: one float dtype (f32,
// bf16 or f16; reference also f64).
MOETRON_KERNEL_DECL(void conv1d_forward(Context& ctx, const Tensor& x, const Tensor& w,
                                        const Tensor& bias, const Conv1dArgs& args,
                                        const Tensor& y))
// dx: [B, L, C_in] overwritten (dtype of x), or undefined when the input
// needs no gradient; dw: [C_out, C_in, K] and dbias: [C_out] accumulated
// (+=), f32 (reference: any float dtype).
MOETRON_KERNEL_DECL(void conv1d_backward(Context& ctx, const Tensor& dy, const Tensor& x,
                                         const Tensor& w, const Conv1dArgs& args, const Tensor& dx,
                                         const Tensor& dw, const Tensor& dbias))

// Shape checks shared by the backends: x [B, L, C_in], w [C_out, C_in, K],
// bias (or dbias) [C_out], y (or dy) [B, L_out, C_out]; returns L_out.
int64_t check_conv1d_shapes(const char* fn, const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Conv1dArgs& args, const Tensor& y);

}  // namespace moetron::kernels
