// AdamW on the CPU: one streaming pass over master, m, v (f32 or bf16:
// loaded into fp32, updated in fp32, stored rounded to nearest even; a bf16
// master stochastically rounded) and grad (f32 or bf16), 16-lane vectors,
// OpenMP over fixed blocks. Bias corrections are formed in double once per
// call, then used as fp32 factors.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/adamw_checks.h"
#include "moetron/kernels/cpu/adamw_factors.h"
#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/cpu/stochastic_store.h"

namespace moetron::kernels::cpu {

namespace {

constexpr int64_t kParallelElems = 32768;
constexpr int64_t kBlock = 4096;  // elements per OpenMP iteration

// W: master storage (bf16: stochastically rounded with `key`), G: grad
// storage, M: moment storage, P: param_copy storage (void: none).
// The update uses the fp32 moments before their store rounds them.
template <typename W, typename G, typename M, typename P>
void adamw_loop(W* w, const G* grad, M* m, M* v, P* copy, int64_t n, const Factors& k,
                uint32_t key) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) \
    firstprivate(w, grad, m, v, copy, n, k, key) if (n > kParallelElems)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; i += 16) {
      const simd::mask16 mk = lane_mask(end - i);
      const simd::vf g = simd::mul(k.scale, load16(grad + i, mk));
      const simd::vf mi = simd::fmadd(k.b1, load16(m + i, mk), simd::mul(k.one_minus_b1, g));
      const simd::vf vi =
          simd::fmadd(k.b2, load16(v + i, mk), simd::mul(k.one_minus_b2, simd::mul(g, g)));
      // (m / bc1) / (sqrt(v / bc2) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)
      const simd::vf denom = simd::fmadd(simd::sqrt(vi), k.inv_sqrt_bc2, k.eps);
      const simd::vf update = simd::div(simd::mul(mi, k.inv_bc1), denom);
      const simd::vf wi = load16(w + i, mk);
      // w - lr * (wd * w + update) = w - lr*wd*w - lr*update
      const simd::vf w_new = simd::fnmadd(k.lr, update, simd::fnmadd(k.lr_wd, wi, wi));
      store16(m + i, mi, mk);
      store16(v + i, vi, mk);
      if constexpr (std::is_same_v<W, bf16>) {
        store16_stochastic(w + i, w_new, end - i, key, i);
      } else {
        store16(w + i, w_new, mk);
      }
      if constexpr (!std::is_void_v<P>) store16(copy + i, w_new, mk);
    }
  }
}

template <typename G, typename M>
void adamw_with_grad(const Tensor& master, const G* grad, const Tensor& m, const Tensor& v,
                     const Tensor& param_copy, const Factors& k, uint32_t key) {
  const int64_t n = master.numel();
  if (master.dtype() == DType::bf16) {  // the working copy itself (checked: no param_copy)
    adamw_loop<bf16, G, M, void>(ptr<bf16>(master), grad, ptr<M>(m), ptr<M>(v), nullptr, n, k, key);
    return;
  }
  float* w = ptr<float>(master);
  if (!param_copy.defined()) {
    adamw_loop<float, G, M, void>(w, grad, ptr<M>(m), ptr<M>(v), nullptr, n, k, key);
    return;
  }
  dispatch_f32_bf16(param_copy.dtype(), "adamw_step param_copy", [&](auto tag) {
    using P = decltype(tag);
    adamw_loop<float, G, M, P>(w, grad, ptr<M>(m), ptr<M>(v), ptr<P>(param_copy), n, k, key);
  });
}

}  // namespace

void adamw_step(Context&, const Tensor& master, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWArgs& args, const Tensor& param_copy) {
  adamw_detail::check_step_args(master, grad, m, v, args, param_copy);
  const Factors k = make_factors(args);
  dispatch_f32_bf16(grad.dtype(), "adamw_step grad", [&](auto gtag) {
    using G = decltype(gtag);
    dispatch_f32_bf16(m.dtype(), "adamw_step moments", [&](auto mtag) {
      using M = decltype(mtag);
      adamw_with_grad<G, M>(master, ptr<G>(grad), m, v, param_copy, k, args.rounding_key);
    });
  });
}

}  // namespace moetron::kernels::cpu
