// 16-lane load/store of f32 or bf16 storage as f32 registers, with a lane
// mask so one loop body covers a row's full vectors and its tail (masked
// loads/stores cost the same as plain ones on this CPU, and the tail needs no
// scalar copy of the math). Used by the pointwise CPU kernels (norm,
// activation, rope, embedding, adamw).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "moetron/core/dtype.h"
#include "moetron/core/error.h"
#include "moetron/kernels/cpu/vec_math.h"

namespace moetron::kernels::cpu {

// Lanes [0, n) set, n clamped to 16.
inline __mmask16 lane_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// Masked-off lanes read as 0.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const bf16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
// Rounds to nearest even (AVX512-BF16 conversion), NaN stays NaN.
inline void store16(bf16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// Calls fn(float{}) or fn(bf16{}) for the storage type of a CPU float tensor.
template <typename Fn>
decltype(auto) dispatch_f32_bf16(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::bf16: return fn(bf16{});
    default: break;
  }
  MOETRON_FAIL(what, ": the CPU backend takes f32 or bf16, got ", dtype_name(dtype));
}

}  // namespace moetron::kernels::cpu
