// 8-bit optimizer state codes on the CPU (kernels/quantized_state.h), for
// the kernels that decode a block into fp32, update it and encode it back.
// Decoding is a 256-entry table times the block's scale; encoding reads the
// code off the bits of y = |x| / scale * (the largest code's magnitude): the
// exponent picks the binade, the top mantissa bits the step within it, and
// random bits added below them round up with probability equal to the
// dropped fraction.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "moetron/kernels/cpu/simd.h"
#include "moetron/kernels/quantized_state.h"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::cpu {

using Table = std::array<float, 256>;

inline const Table& table_of(StateCode code) {
  static const auto build = [](StateCode c) {
    Table t{};
    for (int i = 0; i < 256; ++i)
      t[static_cast<size_t>(i)] = code_value(c, static_cast<uint8_t>(i));
    return t;
  };
  static const Table signed_table = build(StateCode::signed_e4m3);
  static const Table unsigned_table = build(StateCode::unsigned_e4m4);
  return code == StateCode::signed_e4m3 ? signed_table : unsigned_table;
}

// The code of rel = x / (its block's largest |x|) in [-1, 1], branch-free
// so that a block's loop vectorises: normal magnitudes by their bits (the
// exponent picks the binade, random bits added below the kept mantissa
// round up with the dropped fraction's probability), subnormal ones in
// integer steps of the smallest binade's spacing, with the same random bits
// as a fraction. Signed codes carry the sign in bit 7; an unsigned code of a
// positive value is at least 1 (sqrt(v) > 0 never decodes to 0).
template <StateCode kCode>
inline uint8_t encode(float rel, uint32_t random) {
  constexpr CodeFormat f = code_format(kCode);
  constexpr int kBias = f.bias(), kMantissa = f.mantissa_bits;
  constexpr uint32_t kDropped = 23 - static_cast<uint32_t>(kMantissa);
  constexpr uint32_t kMask = (1u << kDropped) - 1;
  constexpr float kSubScale = static_cast<float>(1u << (kBias + kMantissa - 1));
  constexpr float kFracScale = 1.0f / static_cast<float>(1u << kDropped);
  const float y = std::fabs(rel) * f.max_magnitude();
  uint32_t u;
  std::memcpy(&u, &y, 4);
  const uint32_t bits = random & kMask;
  const uint32_t r = u + bits;
  const int e = static_cast<int>(r >> 23) - 127 + kBias;
  const uint32_t normal = std::min(
      (static_cast<uint32_t>(e) << kMantissa) | ((r >> kDropped) & ((1u << kMantissa) - 1)),
      static_cast<uint32_t>(f.top()));
  // exact: y * 2^k < 2^mantissa, and the fraction has kDropped bits
  const auto subnormal =
      static_cast<uint32_t>(y * kSubScale + static_cast<float>(bits) * kFracScale);
  const uint32_t c = static_cast<int>(u >> 23) - 127 + kBias >= 1 ? normal : subnormal;
  if constexpr (f.is_signed) {
    return static_cast<uint8_t>(c | (rel < 0 && c != 0 ? 128u : 0u));
  } else {
    return static_cast<uint8_t>(c == 0 && y > 0 ? 1u : c);
  }
}

#if MOETRON_SIMD_AVX512
// encode<kCode> on 16 values at once (lanes [0, min(count, 16))): the same
// integer and float operations lane by lane, so the same codes; the hash
// is 32-bit multiplies, shifts and xors.
template <StateCode kCode>
inline void encode16(const float* vals, float amax, int64_t count, uint32_t key, int64_t index0,
                     uint8_t* out) {
  constexpr CodeFormat f = code_format(kCode);
  constexpr int kBias = f.bias(), kMantissa = f.mantissa_bits;
  constexpr int kDropped = 23 - kMantissa;
  const __mmask16 lanes = simd::first_lanes(count);
  const __m512 rel = _mm512_div_ps(_mm512_maskz_loadu_ps(lanes, vals), _mm512_set1_ps(amax));
  const __m512 y = _mm512_mul_ps(_mm512_abs_ps(rel), _mm512_set1_ps(f.max_magnitude()));
  const __m512i u = _mm512_castps_si512(y);
  // rounding_bits(key, index0 + lane)
  __m512i x =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0))),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  x = _mm512_add_epi32(_mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x9E3779B9u))),
                       _mm512_set1_epi32(static_cast<int>(key)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x21f0aaad));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x735a2d97));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  const __m512i bits = _mm512_and_si512(x, _mm512_set1_epi32((1 << kDropped) - 1));
  const __m512i r = _mm512_add_epi32(u, bits);
  const __m512i bias = _mm512_set1_epi32(kBias - 127);
  const __m512i e = _mm512_add_epi32(_mm512_srli_epi32(r, 23), bias);
  const __m512i normal =
      _mm512_min_epu32(_mm512_or_si512(_mm512_slli_epi32(e, kMantissa),
                                       _mm512_and_si512(_mm512_srli_epi32(r, kDropped),
                                                        _mm512_set1_epi32((1 << kMantissa) - 1))),
                       _mm512_set1_epi32(f.top()));
  const __m512 t = _mm512_fmadd_ps(
      _mm512_cvtepi32_ps(bits), _mm512_set1_ps(1.0f / static_cast<float>(1 << kDropped)),
      _mm512_mul_ps(y, _mm512_set1_ps(static_cast<float>(1 << (kBias + kMantissa - 1)))));
  const __m512i subnormal = _mm512_cvttps_epu32(t);
  const __mmask16 is_normal = _mm512_cmpge_epi32_mask(
      _mm512_add_epi32(_mm512_srli_epi32(u, 23), bias), _mm512_set1_epi32(1));
  __m512i c = _mm512_mask_blend_epi32(is_normal, subnormal, normal);
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512());
  if constexpr (f.is_signed) {
    const __mmask16 negative = _mm512_cmp_ps_mask(rel, _mm512_setzero_ps(), _CMP_LT_OQ);
    c = _mm512_mask_or_epi32(c, negative & static_cast<__mmask16>(~zero), c,
                             _mm512_set1_epi32(128));
  } else {
    const __mmask16 positive = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ);
    c = _mm512_mask_mov_epi32(c, zero & positive, _mm512_set1_epi32(1));
  }
  _mm512_mask_cvtepi32_storeu_epi8(out, lanes, c);
}
#endif

// Encodes vals[0, len) of block b (element index b * kStateBlock + j). The
// division by the block's maximum (not a multiply by its inverse) keeps
// that value's rel at exactly 1: it encodes to the top code and decodes to
// the scale itself.
template <StateCode kCode>
inline void encode_block_as(const float* vals, int64_t len, int64_t b, uint8_t* codes,
                            float* scales, uint32_t key) {
  float amax = 0;
  for (int64_t j = 0; j < len; ++j) amax = std::max(amax, std::fabs(vals[j]));
  scales[b] = amax;
  const int64_t base = b * kStateBlock;
  uint8_t* out = codes + base;
  if (amax == 0) {
    std::fill(out, out + len, uint8_t{0});
    return;
  }
  int64_t j = 0;
#if MOETRON_SIMD_AVX512
  for (; j < len; j += 16) encode16<kCode>(vals + j, amax, len - j, key, base + j, out + j);
#endif
  for (; j < len; ++j)
    out[j] = encode<kCode>(vals[j] / amax, rounding_bits(key, static_cast<uint32_t>(base + j)));
}

inline void encode_block(StateCode code, const float* vals, int64_t len, int64_t b, uint8_t* codes,
                         float* scales, uint32_t key) {
  if (code == StateCode::signed_e4m3) {
    encode_block_as<StateCode::signed_e4m3>(vals, len, b, codes, scales, key);
  } else {
    encode_block_as<StateCode::unsigned_e4m4>(vals, len, b, codes, scales, key);
  }
}

inline void decode_block(const Table& t, const uint8_t* codes, float scale, int64_t len,
                         float* out) {
  for (int64_t j = 0; j < len; ++j) out[j] = t[codes[j]] * scale;
}

}  // namespace moetron::kernels::cpu
