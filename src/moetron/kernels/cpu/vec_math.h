// AVX-512 math shared by the CPU kernels that need a vectorised exp
// (attention's online softmax, cross-entropy, softmax, router).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace moetron::kernels::cpu {

// exp(x) for 16 floats. Range reduction x = n ln2 + r with |r| <= ln2/2, a
// degree-6 Taylor polynomial (relative error ~1.2e-7, about one ulp), and
// 2^n applied by scalef. Inputs below -87.3 give 0 (or a denormal flushed to
// zero), above 88.7 give +inf; -inf gives 0, which the online softmax needs.
inline __m512 exp512(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
  const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // keeps n finite for -inf
  x = _mm512_min_ps(x, _mm512_set1_ps(88.8f));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }
inline float hmax512(__m512 v) { return _mm512_reduce_max_ps(v); }

// Loads 16 bf16 values (or the first `n` of them, rest zero) widened to f32.
inline __m512 load_bf16x16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load_bf16x16_masked(const uint16_t* p, int n) {
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// Rounds 16 floats to bf16 (nearest even) and stores them.
inline void store_bf16x16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}
inline void store_bf16x16_masked(uint16_t* p, __m512 v, int n) {
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

}  // namespace moetron::kernels::cpu
