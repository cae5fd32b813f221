// The one elementwise step the CUDA matmul needs besides cuBLASLt (internal
// to kernels/cuda/).
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/cuda/cuda_state.h"

namespace moetron::kernels::cuda {

// c = product + beta * c elementwise, rounded once into c (f32 or bf16);
// product: c.numel() floats on the device, or nullptr for an all-zero one
// (a GEMM with k = 0). beta == 0 does not read c, which may hold NaN.
void gemm_epilogue(CudaState& s, const Tensor& c, const float* product, float beta);

}  // namespace moetron::kernels::cuda
