// Device-side helpers shared by the CUDA kernels (.cu files only): dtype
// conversion, dispatch on f32/bf16, block reductions, launch shapes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moetron/core/error.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/cuda/cuda_state.h"

namespace moetron::kernels::cuda {

using bf16_t = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16_t x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
// Round to nearest even, as f32_to_bf16 on the host.
template <>
__device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T = float or bf16_t for an f32 or bf16 tensor.
template <typename Fn>
void dispatch_f32_bf16(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(TypeTag<float>{});
    case DType::bf16:
      return fn(TypeTag<bf16_t>{});
    default:
      break;
  }
  MOETRON_FAIL(what, ": the CUDA backend takes f32 or bf16, got ", dtype_name(dtype));
}

template <typename T>
T* dptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// Reduces v over the block with op (blockDim.x a multiple of 32); every
// thread gets the result. `shared` holds 32 floats. Warps are combined in a
// fixed order, so the result does not depend on scheduling.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  __syncthreads();  // a previous reduction may still be reading shared
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < warps; ++w) v = op(v, shared[w]);
  return v;
}

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Threads for a block that walks a row of n elements: whole warps, at most 512.
inline int row_threads(int64_t n) {
  const int64_t warps = (n + 31) / 32;
  return static_cast<int>(warps >= 16 ? 512 : (warps < 1 ? 32 : warps * 32));
}

// Blocks for n elements, `per_block` each; grids of 1-D kernels stay within
// CUDA's 2^31 - 1 blocks.
inline unsigned blocks_for(int64_t n, int64_t per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  MOETRON_CHECK(b < (int64_t{1} << 31), "CUDA grid of ", b, " blocks is too large");
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace moetron::kernels::cuda
