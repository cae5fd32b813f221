// Vectorised math shared by the CPU kernels that need exp (attention's
// online softmax, cross-entropy, softmax, router), on the 16-lane vectors
// of simd.h.
#pragma once

#include "moetron/kernels/cpu/simd.h"

namespace moetron::kernels::cpu {

// exp(x) for 16 floats. Range reduction x = n ln2 + r with |r| <= ln2/2, a
// degree-6 Taylor polynomial (relative error ~1.2e-7, about one ulp), and
// 2^n applied by scaling. Inputs below -87.3 give 0 (or a denormal flushed to
// zero), above 88.7 give +inf; -inf gives 0, which the online softmax needs.
inline simd::vf exp16(simd::vf x) {
  using namespace simd;
  const vf log2e = set1(1.44269504088896341f);
  const vf ln2_hi = set1(0.693359375f);
  const vf ln2_lo = set1(-2.12194440e-4f);
  x = max(x, set1(-104.0f));  // keeps n finite for -inf
  x = min(x, set1(88.8f));
  const vf n = round_even(mul(x, log2e));
  vf r = fnmadd(n, ln2_hi, x);
  r = fnmadd(n, ln2_lo, r);
  vf p = set1(1.0f / 720.0f);
  p = fmadd(p, r, set1(1.0f / 120.0f));
  p = fmadd(p, r, set1(1.0f / 24.0f));
  p = fmadd(p, r, set1(1.0f / 6.0f));
  p = fmadd(p, r, set1(0.5f));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  return scale_pow2(p, n);
}

}  // namespace moetron::kernels::cpu
