// Cross-entropy on logits on the GPU: one block per row, three passes over
// the row as on the CPU (max, sum of exp, gradient), f32 math for f32 and
// bf16 logits. The row is read whole (max and sum) before any gradient is
// written, so dlogits may alias logits.
#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/cross_entropy_checks.h"
#include "moetron/kernels/cuda/cuda_util.cuh"

namespace moetron::kernels::cuda {

namespace {

// Flags the first t with targets[t] >= V.
__global__ void check_targets_kernel(const int32_t* targets, int64_t T, int64_t V, int32_t* flag) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t < T && targets[t] >= V) atomicMin(flag, static_cast<int32_t>(t));
}

template <typename T>
__global__ void xent_kernel(const T* logits, const int32_t* targets, int64_t V, float grad_scale,
                            float* losses, T* dlogits) {
  __shared__ float shared[32];
  __shared__ float x_target;
  const T* x = logits + blockIdx.x * V;
  const int32_t target = targets[blockIdx.x];
  if (target < 0) {  // ignored: no loss, no gradient
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    for (int64_t v = threadIdx.x; dlogits && v < V; v += blockDim.x) {
      dlogits[blockIdx.x * V + v] = from_f32<T>(0.0f);
    }
    return;
  }
  // Read before the reductions' barriers: no thread writes dlogits until then.
  if (threadIdx.x == 0) x_target = to_f32(x[target]);
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, to_f32(x[v]));
  m = block_reduce(m, MaxOp{}, shared);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(to_f32(x[v]) - m);
  sum = block_reduce(sum, SumOp{}, shared);
  if (threadIdx.x == 0) losses[blockIdx.x] = m + logf(sum) - x_target;
  if (!dlogits) return;
  const float coef = grad_scale / sum;
  T* dl = dlogits + blockIdx.x * V;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float g = expf(to_f32(x[v]) - m) * coef;
    if (v == target) g -= grad_scale;
    dl[v] = from_f32<T>(g);
  }
}

}  // namespace

void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, float grad_scale,
                   const Tensor& losses, const Tensor& dlogits) {
  const char* fn = "cross_entropy";
  ce_detail::check_logits(fn, logits, dlogits);
  const int64_t T = logits.dim(0), V = logits.dim(1);
  ce_detail::check_target_shapes(fn, targets, losses, T);
  MOETRON_CHECK(losses.dtype() == DType::f32, fn, ": losses must be f32 on the CUDA backend, got ",
                losses.str());
  MOETRON_CHECK(T < kCheckNone, fn, ": ", T, " rows exceed the CUDA backend's ", kCheckNone);
  check_on_device(fn, {&logits, &targets, &losses, &dlogits});
  CudaState& s = ctx.cuda_state();
  if (T == 0) return;
  constexpr int kCheckThreads = 256;
  check_targets_kernel<<<blocks_for(T, kCheckThreads), kCheckThreads, 0, s.stream.get()>>>(
      dptr<int32_t>(targets), T, V, reset_check_flag(s));
  check_launch("cross_entropy (target check)");
  if (const int64_t bad = read_check_flag(s); bad >= 0) {
    ce_detail::fail_target(fn, bad, read_i32(s, targets, bad), V);
  }
  dispatch_f32_bf16(logits.dtype(), fn, [&](auto tag) {
    using T_ = typename decltype(tag)::type;
    xent_kernel<T_><<<blocks_for(T, 1), row_threads(V), 0, s.stream.get()>>>(
        dptr<T_>(logits), dptr<int32_t>(targets), V, grad_scale, dptr<float>(losses),
        dlogits.defined() ? dptr<T_>(dlogits) : nullptr);
  });
  check_launch(fn);
}

}  // namespace moetron::kernels::cuda
