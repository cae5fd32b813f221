// AdamW's per-call constants as 16-lane vectors, shared by the CPU AdamW
// kernels (cpu/adamw.cpp, and cpu/quantized_state.cpp for 8-bit state):
// bias corrections formed in double once per call, then used as fp32.
#pragma once

#include <cmath>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/cpu/simd.h"

namespace moetron::kernels::cpu {

struct Factors {
  simd::vf b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_sqrt_bc2, eps, lr, lr_wd, scale;
  bool frozen;  // the variance is frozen: v = 1 * v + 0 * g^2, kept as it is
};

inline Factors make_factors(const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  // A frozen variance: v = 1 * v + 0 * g^2 (exact), with the bias
  // correction of the step it was frozen at.
  const bool frozen = a.variance_frozen();
  const double b2 = frozen ? 1.0 : static_cast<double>(a.beta2);
  const double bc2 =
      1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.variance_step()));
  const auto f = [](double x) { return simd::set1(static_cast<float>(x)); };
  return {f(a.beta1),
          f(1.0 - static_cast<double>(a.beta1)),
          f(b2),
          f(1.0 - b2),
          f(1.0 / bc1),
          f(1.0 / std::sqrt(bc2)),
          f(a.eps),
          f(a.lr),
          f(static_cast<double>(a.lr) * static_cast<double>(a.weight_decay)),
          f(a.grad_scale),
          frozen};
}

}  // namespace moetron::kernels::cpu
