// RMSNorm on the GPU: one block per row, f32 math for f32 and bf16 storage.
// The weight gradient is reduced deterministically, as on the CPU: rows are
// cut into chunks of kChunkRows (a function of T only), each chunk sums its
// rows into its own partial dw in row order, and the partials are added into
// dw in chunk order by a second kernel. No atomics, so dw is the same bits on
// every run.
#include "moetron/kernels/cuda/cuda_util.cuh"
#include "moetron/kernels/norm.h"
#include "moetron/kernels/norm_checks.h"

namespace moetron::kernels::cuda {

namespace {

constexpr int64_t kChunkRows = 32;
constexpr int kColThreads = 256;

template <typename T>
__global__ void forward_kernel(const T* x, const float* w, float eps, T* y, float* rstd,
                               int64_t D) {
  __shared__ float shared[32];
  const T* xr = x + blockIdx.x * D;
  T* yr = y + blockIdx.x * D;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = to_f32(xr[j]);
    ss = fmaf(v, v, ss);
  }
  ss = block_reduce(ss, SumOp{}, shared);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    yr[j] = from_f32<T>(to_f32(xr[j]) * r * w[j]);
  }
}

// dx = rstd * (dy w - xhat mean(dy w xhat)), one block per row.
template <typename T>
__global__ void backward_dx_kernel(const T* dy, const T* x, const float* w, const float* rstd,
                                   T* dx, int64_t D) {
  __shared__ float shared[32];
  const int64_t off = blockIdx.x * D;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    dot = fmaf(to_f32(dy[off + j]) * w[j], to_f32(x[off + j]), dot);
  }
  dot = block_reduce(dot, SumOp{}, shared);
  const float r = rstd[blockIdx.x];
  const float mean_dot = dot * r / static_cast<float>(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xhat = to_f32(x[off + j]) * r;
    const float gw = to_f32(dy[off + j]) * w[j];
    dx[off + j] = from_f32<T>(r * fmaf(-xhat, mean_dot, gw));
  }
}

// partial[c, j] = sum over the rows t of chunk c, in order, of dy[t, j] xhat[t, j].
template <typename T>
__global__ void backward_dw_partial_kernel(const T* dy, const T* x, const float* rstd,
                                           float* partial, int64_t rows, int64_t D) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= D) return;
  const int64_t c = blockIdx.y;
  const int64_t end = min(rows, (c + 1) * kChunkRows);
  float acc = 0.0f;
  for (int64_t t = c * kChunkRows; t < end; ++t) {
    acc = fmaf(to_f32(dy[t * D + j]), to_f32(x[t * D + j]) * rstd[t], acc);
  }
  partial[c * D + j] = acc;
}

__global__ void backward_dw_sum_kernel(const float* partial, int64_t chunks, float* dw, int64_t D) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= D) return;
  float s = partial[j];
  for (int64_t c = 1; c < chunks; ++c) s += partial[c * D + j];
  dw[j] += s;
}

}  // namespace

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  const norm_detail::Dims d = norm_detail::check_common("rmsnorm_forward", x, w, rstd);
  check_tensor(y, "rmsnorm y", x.shape(), x.dtype());
  check_on_device("rmsnorm_forward", {&x, &w, &y, &rstd});
  CudaState& s = ctx.cuda_state();
  if (d.rows == 0) return;
  const unsigned rows = blocks_for(d.rows, 1);
  dispatch_f32_bf16(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_kernel<T><<<rows, row_threads(d.cols), 0, s.stream.get()>>>(
        dptr<T>(x), dptr<float>(w), eps, dptr<T>(y), dptr<float>(rstd), d.cols);
  });
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  const norm_detail::Dims d = norm_detail::check_common("rmsnorm_backward", x, w, rstd);
  check_tensor(dy, "rmsnorm dy", x.shape(), x.dtype());
  check_tensor(dx, "rmsnorm dx", x.shape(), x.dtype());
  check_tensor(dw, "rmsnorm dw", {d.cols}, DType::f32);
  check_on_device("rmsnorm_backward", {&dy, &x, &w, &rstd, &dx, &dw});
  CudaState& s = ctx.cuda_state();
  if (d.rows == 0 || d.cols == 0) return;
  const int64_t chunks = (d.rows + kChunkRows - 1) / kChunkRows;
  MOETRON_CHECK(chunks <= 65535, "rmsnorm_backward: ", d.rows, " rows exceed the CUDA backend's ",
                65535 * kChunkRows);
  Tensor partial = scratch(s, {chunks, d.cols}, DType::f32);
  const dim3 col_grid(blocks_for(d.cols, kColThreads), static_cast<unsigned>(chunks));
  dispatch_f32_bf16(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_dx_kernel<T><<<blocks_for(d.rows, 1), row_threads(d.cols), 0, s.stream.get()>>>(
        dptr<T>(dy), dptr<T>(x), dptr<float>(w), dptr<float>(rstd), dptr<T>(dx), d.cols);
    backward_dw_partial_kernel<T><<<col_grid, kColThreads, 0, s.stream.get()>>>(
        dptr<T>(dy), dptr<T>(x), dptr<float>(rstd), dptr<float>(partial), d.rows, d.cols);
  });
  backward_dw_sum_kernel<<<blocks_for(d.cols, kColThreads), kColThreads, 0, s.stream.get()>>>(
      dptr<float>(partial), chunks, dptr<float>(dw), d.cols);
  check_launch("rmsnorm_backward");
}

}  // namespace moetron::kernels::cuda
