#include "moetron/kernels/cuda/cuda_util.cuh"
#include "moetron/kernels/cuda/matmul_epilogue.h"

namespace moetron::kernels::cuda {

namespace {

template <typename T>
__global__ void epilogue_kernel(T* c, const float* product, float beta, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = product ? product[i] : 0.0f;
    if (beta != 0.0f) v += beta * to_f32(c[i]);
    c[i] = from_f32<T>(v);
  }
}

}  // namespace

void gemm_epilogue(CudaState& s, const Tensor& c, const float* product, float beta) {
  const int64_t n = c.numel();
  if (n == 0) return;
  constexpr int kThreads = 256;
  // Grid-stride: a few waves of blocks are enough for a streaming pass.
  const unsigned blocks = std::min<unsigned>(blocks_for(n, kThreads), 65536u);
  dispatch_f32_bf16(c.dtype(), "matmul c", [&](auto tag) {
    using T = typename decltype(tag)::type;
    epilogue_kernel<T><<<blocks, kThreads, 0, s.stream.get()>>>(dptr<T>(c), product, beta, n);
  });
  check_launch("matmul epilogue");
}

}  // namespace moetron::kernels::cuda
