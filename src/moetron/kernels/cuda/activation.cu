// SwiGLU on the GPU: an elementwise pass, f32 math for f32 and bf16
// storage. Grid: one row of gate_up per blockIdx.x (2^31 - 1 rows), column
// blocks along blockIdx.y, so no 64-bit division per element.
#include "moetron/kernels/activation.h"
#include "moetron/kernels/activation_checks.h"
#include "moetron/kernels/cuda/cuda_util.cuh"

namespace moetron::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// sigmoid(g) = 1 / (1 + exp(-g)); expf overflows to +inf for g < -88.7,
// giving sigmoid 0 and silu -0, as in exact arithmetic.
__device__ __forceinline__ float sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

template <typename T>
__global__ void forward_kernel(const T* gate_up, T* out, int64_t F) {
  const int64_t j = blockIdx.y * int64_t{kThreads} + threadIdx.x;
  if (j >= F) return;
  const T* g = gate_up + blockIdx.x * 2 * F;
  const float gv = to_f32(g[j]);
  out[blockIdx.x * F + j] = from_f32<T>(gv * sigmoid(gv) * to_f32(g[F + j]));
}

template <typename T>
__global__ void backward_kernel(const T* dout, const T* gate_up, T* d_gate_up, int64_t F) {
  const int64_t j = blockIdx.y * int64_t{kThreads} + threadIdx.x;
  if (j >= F) return;
  const int64_t row = blockIdx.x * 2 * F;
  const float gv = to_f32(gate_up[row + j]), uv = to_f32(gate_up[row + F + j]);
  const float dv = to_f32(dout[blockIdx.x * F + j]);
  const float s = sigmoid(gv);
  const float silu = gv * s;
  // d silu / dg = s * (1 + g * (1 - s)) = s + silu * (1 - s)
  const float dsilu = fmaf(silu, 1.0f - s, s);
  d_gate_up[row + j] = from_f32<T>(dv * uv * dsilu);
  d_gate_up[row + F + j] = from_f32<T>(dv * silu);
}

dim3 grid(int64_t rows, int64_t F) {
  const int64_t col_blocks = (F + kThreads - 1) / kThreads;
  MOETRON_CHECK(col_blocks <= 65535, "swiglu: F = ", F, " exceeds the CUDA backend's ",
                65535 * kThreads);
  return dim3(blocks_for(rows, 1), static_cast<unsigned>(col_blocks));
}

}  // namespace

void swiglu_forward(Context& ctx, const Tensor& gate_up, const Tensor& out) {
  const int64_t F = activation_detail::check_swiglu("swiglu_forward", gate_up, out, "swiglu out");
  check_on_device("swiglu_forward", {&gate_up, &out});
  CudaState& s = ctx.cuda_state();
  if (gate_up.dim(0) == 0 || F == 0) return;
  dispatch_f32_bf16(gate_up.dtype(), "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<grid(gate_up.dim(0), F), kThreads, 0, s.stream.get()>>>(dptr<T>(gate_up),
                                                                                dptr<T>(out), F);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up,
                     const Tensor& d_gate_up) {
  const int64_t F =
      activation_detail::check_swiglu("swiglu_backward", gate_up, dout, "swiglu dout");
  check_tensor(d_gate_up, "swiglu d_gate_up", gate_up.shape(), gate_up.dtype());
  check_on_device("swiglu_backward", {&dout, &gate_up, &d_gate_up});
  CudaState& s = ctx.cuda_state();
  if (gate_up.dim(0) == 0 || F == 0) return;
  dispatch_f32_bf16(gate_up.dtype(), "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_kernel<T><<<grid(gate_up.dim(0), F), kThreads, 0, s.stream.get()>>>(
        dptr<T>(dout), dptr<T>(gate_up), dptr<T>(d_gate_up), F);
  });
  check_launch("swiglu_backward");
}

}  // namespace moetron::kernels::cuda
