// 16-lane loads and stores of f32 or bf16 rows as f32 vectors, with a tail
// mask for row lengths that are not a multiple of 16 (used by the MoE and
// cross-entropy CPU kernels).
//
// The bf16 widening is written with zero-masked intrinsics instead of
// vec_math.h's load_bf16x16: GCC 12 reports the unmasked forms'
// _mm512_undefined_epi32() pass-through as -Wmaybe-uninitialized once they
// are inlined, which -Werror turns into a build failure.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "moetron/core/dtype.h"
#include "moetron/kernels/cpu/vec_math.h"

namespace moetron::kernels::cpu::row_io {

inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

inline __m512 widen_bf16(__m256i raw) {
  const __mmask16 all = 0xffff;
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, raw), 16));
}

// The first min(n, 16) elements at p as f32; lanes past n are 0.
inline __m512 load16(const float* p, int64_t n) {
  return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(tail_mask(n), p);
}
inline __m512 load16(const bf16* p, int64_t n) {
  const __m256i raw = n >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi16(tail_mask(n), p);
  return widen_bf16(raw);
}
// Lanes past n read `fill` instead (e.g. -inf for a max or a softmax).
inline __m512 load16_or(const float* p, int64_t n, __m512 fill) {
  return n >= 16 ? _mm512_loadu_ps(p) : _mm512_mask_blend_ps(tail_mask(n), fill, load16(p, n));
}
inline __m512 load16_or(const bf16* p, int64_t n, __m512 fill) {
  return n >= 16 ? load16(p, n) : _mm512_mask_blend_ps(tail_mask(n), fill, load16(p, n));
}

// Stores the first min(n, 16) lanes (bf16: rounded to nearest even).
inline void store16(float* p, __m512 v, int64_t n) {
  if (n >= 16) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, tail_mask(n), v);
  }
}
inline void store16(bf16* p, __m512 v, int64_t n) {
  auto* q = reinterpret_cast<uint16_t*>(p);
  if (n >= 16) {
    store_bf16x16(q, v);
  } else {
    store_bf16x16_masked(q, v, static_cast<int>(n));
  }
}

}  // namespace moetron::kernels::cpu::row_io
