// AdamW on the GPU: one streaming pass over master, m, v and grad, the CPU
// backend's arithmetic (fp32, bias corrections formed in double once per
// call, the same fused multiply-adds), so the two agree to rounding.
#include <cmath>
#include <type_traits>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/adamw_checks.h"
#include "moetron/kernels/cuda/cuda_util.cuh"

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

// G: grad storage, M: moment storage, P: param_copy storage (void: none).
template <typename G, typename M, typename P>
__global__ void adamw_kernel(float* w, const G* grad, M* m, M* v, P* copy, int64_t n, Factors k) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = k.scale * to_f32(grad[i]);
    const float mi = fmaf(k.b1, to_f32(m[i]), k.one_minus_b1 * g);
    const float vi = fmaf(k.b2, to_f32(v[i]), k.one_minus_b2 * (g * g));
    // (m / bc1) / (sqrt(v / bc2) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)
    const float denom = fmaf(sqrtf(vi), k.inv_sqrt_bc2, k.eps);
    const float update = (mi * k.inv_bc1) / denom;
    const float wi = w[i];
    // w - lr * (wd * w + update) = (w - lr*wd*w) - lr*update
    const float w_new = fmaf(-k.lr, update, fmaf(-k.lr_wd, wi, wi));
    m[i] = from_f32<M>(mi);
    v[i] = from_f32<M>(vi);
    w[i] = w_new;
    if constexpr (!std::is_void_v<P>) copy[i] = from_f32<P>(w_new);
  }
}

template <typename G, typename M, typename P>
void launch(CudaState& s, const Tensor& master, const Tensor& grad, const Tensor& m,
            const Tensor& v, P* copy, const Factors& k) {
  const int64_t n = master.numel();
  // Grid-stride over a few waves of blocks: a streaming pass needs no more.
  const unsigned blocks = std::min<unsigned>(blocks_for(n, kThreads), 65536u);
  adamw_kernel<G, M, P><<<blocks, kThreads, 0, s.stream.get()>>>(
      dptr<float>(master), dptr<G>(grad), dptr<M>(m), dptr<M>(v), copy, n, k);
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
      if (!param_copy.defined()) return launch<G, M, void>(s, master, grad, m, v, nullptr, k);
      dispatch_f32_bf16(param_copy.dtype(), "adamw_step param_copy", [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        launch<G, M, P>(s, master, grad, m, v, dptr<P>(param_copy), k);
      });
    });
  });
  check_launch("adamw_step");
}

}  // namespace moetron::kernels::cuda
