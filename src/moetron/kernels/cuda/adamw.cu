// AdamW on the GPU: one streaming pass over master, m, v and grad, the CPU
// backend's arithmetic (fp32, bias corrections formed in double once per
// call, the same fused multiply-adds), so the two agree to rounding.
#include <cmath>
#include <type_traits>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/adamw_checks.h"
#include "moetron/kernels/cuda/cuda_util.cuh"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct Factors {
  float b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_sqrt_bc2, eps, lr, lr_wd, scale;
};

Factors make_factors(const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  // A frozen variance: v = 1 * v + 0 * g^2 (exact), with the bias
  // correction of the step it was frozen at.
  const bool frozen = a.variance_frozen();
  const double b2 = frozen ? 1.0 : static_cast<double>(a.beta2);
  const double bc2 =
      1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.variance_step()));
  const auto f = [](double x) { return static_cast<float>(x); };
  return {a.beta1,
          f(1.0 - static_cast<double>(a.beta1)),
          f(b2),
          f(1.0 - b2),
          f(1.0 / bc1),
          f(1.0 / std::sqrt(bc2)),
          a.eps,
          a.lr,
          f(static_cast<double>(a.lr) * static_cast<double>(a.weight_decay)),
          a.grad_scale};
}

// A bf16 master is stored stochastically rounded, with the bits every
// backend draws for that element (kernels/stochastic_round.h).
__device__ __forceinline__ void store_master(float* w, float x, uint32_t, int64_t) {
  *w = x;
}
__device__ __forceinline__ void store_master(bf16_t* w, float x, uint32_t key, int64_t i) {
  const uint16_t bits =
      bf16_bits_stochastic(__float_as_uint(x), rounding_bits(key, static_cast<uint32_t>(i)));
  *w = __ushort_as_bfloat16(bits);
}

// W: master storage, G: grad storage, M: moment storage, P: param_copy
// storage (void: none).
template <typename W, typename G, typename M, typename P>
__global__ void adamw_kernel(W* w, const G* grad, M* m, M* v, P* copy, int64_t n, Factors k,
                             uint32_t key) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = k.scale * to_f32(grad[i]);
    const float mi = fmaf(k.b1, to_f32(m[i]), k.one_minus_b1 * g);
    const float vi = fmaf(k.b2, to_f32(v[i]), k.one_minus_b2 * (g * g));
    // (m / bc1) / (sqrt(v / bc2) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)
    const float denom = fmaf(sqrtf(vi), k.inv_sqrt_bc2, k.eps);
    const float update = (mi * k.inv_bc1) / denom;
    const float wi = to_f32(w[i]);
    // w - lr * (wd * w + update) = (w - lr*wd*w) - lr*update
    const float w_new = fmaf(-k.lr, update, fmaf(-k.lr_wd, wi, wi));
    m[i] = from_f32<M>(mi);
    v[i] = from_f32<M>(vi);
    store_master(w + i, w_new, key, i);
    if constexpr (!std::is_void_v<P>) copy[i] = from_f32<P>(w_new);
  }
}

template <typename W, typename G, typename M, typename P>
void launch(CudaState& s, const Tensor& master, const Tensor& grad, const Tensor& m,
            const Tensor& v, P* copy, const Factors& k, uint32_t key) {
  const int64_t n = master.numel();
  // Grid-stride over a few waves of blocks: a streaming pass needs no more.
  const unsigned blocks = std::min<unsigned>(blocks_for(n, kThreads), 65536u);
  adamw_kernel<W, G, M, P><<<blocks, kThreads, 0, s.stream.get()>>>(
      dptr<W>(master), dptr<G>(grad), dptr<M>(m), dptr<M>(v), copy, n, k, key);
}

}  // namespace

void adamw_step(Context& ctx, const Tensor& master, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWArgs& args, const Tensor& param_copy) {
  adamw_detail::check_step_args(master, grad, m, v, args, param_copy);
  check_on_device("adamw_step", {&master, &grad, &m, &v, &param_copy});
  CudaState& s = ctx.cuda_state();
  if (master.numel() == 0) return;
  const Factors k = make_factors(args);
  dispatch_f32_bf16(grad.dtype(), "adamw_step grad", [&](auto gtag) {
    using G = typename decltype(gtag)::type;
    dispatch_f32_bf16(m.dtype(), "adamw_step moments", [&](auto mtag) {
      using M = typename decltype(mtag)::type;
      const uint32_t key = args.rounding_key;
      if (master.dtype() == DType::bf16) {  // checked: no param_copy
        return launch<bf16_t, G, M, void>(s, master, grad, m, v, nullptr, k, key);
      }
      if (!param_copy.defined()) {
        return launch<float, G, M, void>(s, master, grad, m, v, nullptr, k, key);
      }
      dispatch_f32_bf16(param_copy.dtype(), "adamw_step param_copy", [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        launch<float, G, M, P>(s, master, grad, m, v, dptr<P>(param_copy), k, key);
      });
    });
  });
  check_launch("adamw_step");
}

}  // namespace moetron::kernels::cuda
