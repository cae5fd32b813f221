// RMSNorm on the CPU: one row per OpenMP iteration, AVX-512 over the row,
// f32 math for f32 and bf16 storage. The weight gradient is reduced
// deterministically: rows are cut into a fixed number of chunks (a function
// of T only, never of the thread count), each chunk sums its rows into its
// own partial dw in row order, and the partials are added in chunk order.
#include "moetron/kernels/norm.h"

#include <algorithm>
#include <cmath>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/norm_checks.h"

namespace moetron::kernels::cpu {

namespace {

// Parallelise only when the work pays for waking the team.
constexpr int64_t kParallelElems = 16384;
// At most this many dw partials: T * D work, kMaxChunks * D extra memory.
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kMinChunkRows = 16;

int64_t dw_chunk_rows(int64_t rows) {
  return std::max(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
}

// Sum of x^2 over a row, two accumulators to hide FMA latency.
template <typename T>
float row_sum_squares(const T* xr, int64_t n) {
  simd::vf a0 = simd::zero(), a1 = simd::zero();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const simd::vf v0 = load16(xr + j, 0xffff), v1 = load16(xr + j + 16, 0xffff);
    a0 = simd::fmadd(v0, v0, a0);
    a1 = simd::fmadd(v1, v1, a1);
  }
  for (; j < n; j += 16) {
    const simd::vf v = load16(xr + j, lane_mask(n - j));
    a0 = simd::fmadd(v, v, a0);
  }
  return simd::reduce_add(simd::add(a0, a1));
}

}  // namespace

void rmsnorm_forward(Context&, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  const norm_detail::Dims d = norm_detail::check_common("rmsnorm_forward", x, w, rstd);
  check_tensor(y, "rmsnorm y", x.shape(), x.dtype());
  dispatch_f32_bf16(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    const float* pw = ptr<float>(w);
    float* pr = ptr<float>(rstd);
    const int64_t D = d.cols;
#pragma omp parallel for schedule(static) \
    firstprivate(D, px, py, pw, pr, eps) if (d.rows * D > kParallelElems)
    for (int64_t t = 0; t < d.rows; ++t) {
      const T* xr = px + t * D;
      T* yr = py + t * D;
      const float ms = row_sum_squares(xr, D) / static_cast<float>(D);
      const float r = 1.0f / std::sqrt(ms + eps);
      pr[t] = r;
      const simd::vf rv = simd::set1(r);
      for (int64_t j = 0; j < D; j += 16) {
        const simd::mask16 m = lane_mask(D - j);
        const simd::vf xhat = simd::mul(load16(xr + j, m), rv);
        store16(yr + j, simd::mul(xhat, load16(pw + j, m)), m);
      }
    }
  });
}

Scratch rmsnorm_backward_scratch(int64_t rows, int64_t cols) {
  MOETRON_CHECK(rows >= 0 && cols >= 0, "rmsnorm_backward_scratch: bad shape [", rows, ", ", cols,
                "]");
  if (rows == 0 || cols == 0) return {};  // the kernel returns before allocating
  const int64_t chunk_rows = dw_chunk_rows(rows);
  Scratch s;
  add_scratch(s, (rows + chunk_rows - 1) / chunk_rows * cols, DType::f32);
  return s;
}

void rmsnorm_backward(Context&, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  const norm_detail::Dims d = norm_detail::check_common("rmsnorm_backward", x, w, rstd);
  check_tensor(dy, "rmsnorm dy", x.shape(), x.dtype());
  check_tensor(dx, "rmsnorm dx", x.shape(), x.dtype());
  check_tensor(dw, "rmsnorm dw", {d.cols}, DType::f32);
  if (d.rows == 0 || d.cols == 0) return;
  const int64_t D = d.cols;
  const int64_t chunk_rows = dw_chunk_rows(d.rows);
  const int64_t chunks = (d.rows + chunk_rows - 1) / chunk_rows;
  Tensor partial = Tensor::empty({chunks, D}, DType::f32, MemTag::workspace);
  float* pp = ptr<float>(partial);

  dispatch_f32_bf16(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    const T* pdy = ptr<T>(dy);
    T* pdx = ptr<T>(dx);
    const float* pw = ptr<float>(w);
    const float* pr = ptr<float>(rstd);
    const float inv_d = 1.0f / static_cast<float>(D);
    // firstprivate: shared scalars would be re-read after every store
    // through a float pointer (the compiler cannot rule out aliasing).
#pragma omp parallel for schedule(static) \
    firstprivate(D, inv_d, px, pdy, pdx, pw, pr, pp) if (d.rows * D > kParallelElems)
    for (int64_t c = 0; c < chunks; ++c) {
      float* acc = pp + c * D;
      std::fill(acc, acc + D, 0.0f);
      const int64_t end = std::min(d.rows, (c + 1) * chunk_rows);
      for (int64_t t = c * chunk_rows; t < end; ++t) {
        const T* xr = px + t * D;
        const T* gr = pdy + t * D;
        T* dxr = pdx + t * D;
        // mean(dxhat * xhat) = rstd * mean(dy * w * x)
        simd::vf dotv = simd::zero();
        for (int64_t j = 0; j < D; j += 16) {
          const simd::mask16 m = lane_mask(D - j);
          const simd::vf gw = simd::mul(load16(gr + j, m), load16(pw + j, m));
          dotv = simd::fmadd(gw, load16(xr + j, m), dotv);
        }
        const float r = pr[t];
        const simd::vf rv = simd::set1(r);
        const simd::vf mean_dot = simd::set1(simd::reduce_add(dotv) * r * inv_d);
        for (int64_t j = 0; j < D; j += 16) {
          const simd::mask16 m = lane_mask(D - j);
          const simd::vf g = load16(gr + j, m);
          const simd::vf xhat = simd::mul(load16(xr + j, m), rv);
          const simd::vf gw = simd::mul(g, load16(pw + j, m));
          store16(dxr + j, simd::mul(rv, simd::fnmadd(xhat, mean_dot, gw)), m);
          store16(acc + j, simd::fmadd(g, xhat, load16(acc + j, m)), m);
        }
      }
    }
  });

  // dw += partial[0] + partial[1] + ... in chunk order, columns in parallel.
  float* pdw = ptr<float>(dw);
  const int64_t col_blocks = (D + 15) / 16;
#pragma omp parallel for schedule(static) if (chunks * D > kParallelElems)
  for (int64_t b = 0; b < col_blocks; ++b) {
    const int64_t j = b * 16;
    const simd::mask16 m = lane_mask(D - j);
    simd::vf s = load16(pp + j, m);
    for (int64_t c = 1; c < chunks; ++c) s = simd::add(s, load16(pp + c * D + j, m));
    store16(pdw + j, simd::add(load16(pdw + j, m), s), m);
  }
}

}  // namespace moetron::kernels::cpu
