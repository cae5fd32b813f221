// The 16-lane f32 vector the CPU kernels are written in, on two backends:
//
//   AVX-512 (F, BW, VL and BF16 present at build time): every operation is
//     one intrinsic, so the kernels compile to what they were written for;
//   portable (any other x86-64 or other CPU): GCC vector extensions, which
//     the compiler lowers to the widest vectors the target has (two AVX2
//     registers per vector on AVX2 machines), masks as 16-bit lane sets.
//
// One kernel source serves both, so the tests on a machine without AVX-512
// check the same kernel logic that runs on one with it. Rounding to bf16 is
// to nearest even on both (NaN stays NaN); the portable path keeps f32
// denormals as core/dtype.h's conversion does, where AVX-512 BF16 flushes
// them. Loads and stores take unaligned pointers; a mask's lane i is bit i.
#pragma once

#include <cstdint>
#include <cstring>

#include "moetron/core/dtype.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__)
#define MOETRON_SIMD_AVX512 1
#include <immintrin.h>
#else
#define MOETRON_SIMD_AVX512 0
#if defined(__F16C__)
#include <immintrin.h>
#endif
#endif

namespace moetron::kernels::cpu::simd {

using mask16 = uint16_t;
inline constexpr mask16 kAll = 0xffff;

// Lanes [0, n) set, n clamped to [0, 16].
inline mask16 first_lanes(int64_t n) {
  return n >= 16 ? kAll : (n <= 0 ? mask16{0} : static_cast<mask16>((1u << n) - 1u));
}

#if MOETRON_SIMD_AVX512

using vf = __m512;
using vi = __m512i;

inline vf set1(float x) {
  return _mm512_set1_ps(x);
}
inline vf zero() {
  return _mm512_setzero_ps();
}
inline vf load(const float* p) {
  return _mm512_loadu_ps(p);
}
inline vf load(const float* p, mask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline void store(float* p, vf v) {
  _mm512_storeu_ps(p, v);
}
inline void store(float* p, vf v, mask16 m) {
  _mm512_mask_storeu_ps(p, m, v);
}

inline vf add(vf a, vf b) {
  return _mm512_add_ps(a, b);
}
inline vf sub(vf a, vf b) {
  return _mm512_sub_ps(a, b);
}
inline vf mul(vf a, vf b) {
  return _mm512_mul_ps(a, b);
}
inline vf div(vf a, vf b) {
  return _mm512_div_ps(a, b);
}
inline vf max(vf a, vf b) {
  return _mm512_max_ps(a, b);
}
inline vf min(vf a, vf b) {
  return _mm512_min_ps(a, b);
}
inline vf sqrt(vf a) {
  return _mm512_sqrt_ps(a);
}
inline vf fmadd(vf a, vf b, vf c) {
  return _mm512_fmadd_ps(a, b, c);
}  // a b + c
inline vf fmsub(vf a, vf b, vf c) {
  return _mm512_fmsub_ps(a, b, c);
}  // a b - c
inline vf fnmadd(vf a, vf b, vf c) {
  return _mm512_fnmadd_ps(a, b, c);
}  // c - a b
inline float reduce_add(vf a) {
  return _mm512_reduce_add_ps(a);
}
inline float reduce_max(vf a) {
  return _mm512_reduce_max_ps(a);
}

// Lane i: m_i ? b_i : a_i.
inline vf blend(mask16 m, vf a, vf b) {
  return _mm512_mask_blend_ps(m, a, b);
}
// Lane i: m_i ? a_i : 0.
inline vf keep(mask16 m, vf a) {
  return _mm512_maskz_mov_ps(m, a);
}
// Lane i: m_i ? -a_i : a_i.
inline vf negate_where(mask16 m, vf a) {
  return _mm512_mask_xor_ps(a, m, a, _mm512_set1_ps(-0.0f));
}
inline mask16 less(vf a, vf b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
}

// Nearest integer (ties to even), as a float.
inline vf round_even(vf a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// a * 2^n for integral n.
inline vf scale_pow2(vf a, vf n) {
  return _mm512_scalef_ps(a, n);
}
// Integral-valued lanes to int32, and the bits of an int32 test.
inline vi to_int(vf integral) {
  return _mm512_cvtps_epi32(integral);
}
inline mask16 test_bits(vi a, int32_t bits) {
  return _mm512_test_epi32_mask(a, _mm512_set1_epi32(bits));
}

inline vf widen_bf16(__m256i raw) {
  // Zero-masked forms: GCC 12 reports the unmasked ones' undefined
  // pass-through as maybe-uninitialized once inlined.
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, raw), 16));
}
inline vf load(const bf16* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline vf load(const bf16* p, mask16 m) {
  return widen_bf16(_mm256_maskz_loadu_epi16(m, p));
}
inline void store(bf16* p, vf v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}
inline void store(bf16* p, vf v, mask16 m) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

inline vf load(const f16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store(f16* p, vf v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// dst[2i] = bf16(row0_i), dst[2i + 1] = bf16(row1_i): 32 bf16 as 16 pairs.
inline void store_bf16_pairs(uint16_t* dst, vf row0, vf row1) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                    21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                    11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(row1, row0);  // row0 low, row1 high
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), both));
}

// acc_i + a_{2i} b_{2i} + a_{2i+1} b_{2i+1} over 16 bf16 pairs: `a` and `b`
// each hold 16 32-bit words of two bf16 (the lower-addressed element in
// the low half).
inline vf dot_bf16_pairs(vf acc, const uint32_t* a, const uint32_t* b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
}
// Same with one pair (a word) broadcast to every lane.
inline vf dot_bf16_pairs(vf acc, uint32_t a, const uint32_t* b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(a)),
                          (__m512bh)_mm512_loadu_si512(b));
}

#else  // portable

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu_ __attribute__((vector_size(64)));

inline vf set1(float x) {
  return vf{} + x;
}
inline vf zero() {
  return vf{};
}
inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline vf load(const float* p, mask16 m) {
  if (m == kAll) return load(p);
  vf v{};
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) v[i] = p[i];
  return v;
}
inline void store(float* p, vf v) {
  std::memcpy(p, &v, sizeof(v));
}
inline void store(float* p, vf v, mask16 m) {
  if (m == kAll) return store(p, v);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) p[i] = v[i];
}

inline vf add(vf a, vf b) {
  return a + b;
}
inline vf sub(vf a, vf b) {
  return a - b;
}
inline vf mul(vf a, vf b) {
  return a * b;
}
inline vf div(vf a, vf b) {
  return a / b;
}
inline vf max(vf a, vf b) {
  return a > b ? a : b;
}
inline vf min(vf a, vf b) {
  return a < b ? a : b;
}
inline vf sqrt(vf a) {
  for (int i = 0; i < 16; ++i) a[i] = __builtin_sqrtf(a[i]);
  return a;
}
inline vf fmadd(vf a, vf b, vf c) {
  return a * b + c;
}
inline vf fmsub(vf a, vf b, vf c) {
  return a * b - c;
}
inline vf fnmadd(vf a, vf b, vf c) {
  return c - a * b;
}
inline float reduce_add(vf a) {
  // Halving tree, the order AVX-512's reduction uses.
  float s[16];
  std::memcpy(s, &a, sizeof(s));
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) s[i] += s[i + w];
  return s[0];
}
inline float reduce_max(vf a) {
  float m = a[0];
  for (int i = 1; i < 16; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

inline vi lanes_of(mask16 m) {
  const vi bit = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  return (bit & static_cast<int32_t>(m)) != 0;
}
inline mask16 mask_of(vi lanes) {
  mask16 m = 0;
  for (int i = 0; i < 16; ++i) m = static_cast<mask16>(m | ((lanes[i] != 0 ? 1u : 0u) << i));
  return m;
}
inline vf blend(mask16 m, vf a, vf b) {
  return lanes_of(m) ? b : a;
}
inline vf keep(mask16 m, vf a) {
  return lanes_of(m) ? a : vf{};
}
inline vf negate_where(mask16 m, vf a) {
  return lanes_of(m) ? -a : a;
}
inline mask16 less(vf a, vf b) {
  return mask_of(a < b);
}

inline vf round_even(vf a) {
  // Adding and removing 1.5 * 2^23 rounds to nearest even in the current
  // (default) rounding mode; exact for |a| < 2^22, and larger floats are
  // integers already.
  const vf magic = set1(12582912.0f);
  const vf r = (a + magic) - magic;
  const vf mag = a < 0 ? -a : a;
  return mag < 4194304.0f ? r : a;
}
inline vf scale_pow2(vf a, vf n) {
  // 2^n built from its exponent bits, n clamped to [-127, 128]: -127 gives
  // 0 and 128 gives inf, the limits exp and friends need.
  vi e = __builtin_convertvector(n, vi);
  e = e < -127 ? vi{} - 127 : (e > 128 ? vi{} + 128 : e);
  const vi bits = (e + 127) << 23;
  vf p;
  std::memcpy(&p, &bits, sizeof(p));
  return a * p;
}
inline vi to_int(vf integral) {
  return __builtin_convertvector(integral, vi);
}
inline mask16 test_bits(vi a, int32_t bits) {
  return mask_of((a & bits) != 0);
}

inline vf load(const bf16* p) {
  uint16_t raw[16];
  std::memcpy(raw, p, sizeof(raw));
  vu_ u;
  for (int i = 0; i < 16; ++i) u[i] = static_cast<uint32_t>(raw[i]) << 16;
  vf v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
inline vf load(const bf16* p, mask16 m) {
  if (m == kAll) return load(p);
  vf v{};
  const auto* q = reinterpret_cast<const uint16_t*>(p);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) v[i] = bf16_to_f32(q[i]);
  return v;
}
inline void to_bf16_bits(vf v, uint16_t* out) {
  vu_ u;
  std::memcpy(&u, &v, sizeof(u));
  const vu_ rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const vu_ nan = (u >> 16) | 0x40u;
  const vu_ r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  for (int i = 0; i < 16; ++i) out[i] = static_cast<uint16_t>(r[i]);
}
inline void store(bf16* p, vf v) {
  uint16_t out[16];
  to_bf16_bits(v, out);
  std::memcpy(p, out, sizeof(out));
}
inline void store(bf16* p, vf v, mask16 m) {
  uint16_t out[16];
  to_bf16_bits(v, out);
  auto* q = reinterpret_cast<uint16_t*>(p);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) q[i] = out[i];
}

inline vf load(const f16* p) {
  vf v;
#if defined(__F16C__)
  const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  std::memcpy(&v, &lo, 32);
  std::memcpy(reinterpret_cast<char*>(&v) + 32, &hi, 32);
#else
  const auto* q = reinterpret_cast<const uint16_t*>(p);
  for (int i = 0; i < 16; ++i) v[i] = f16_to_f32(q[i]);
#endif
  return v;
}
inline void store(f16* p, vf v) {
#if defined(__F16C__)
  __m256 lo, hi;
  std::memcpy(&lo, &v, 32);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + 32, 32);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8),
                   _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  auto* q = reinterpret_cast<uint16_t*>(p);
  for (int i = 0; i < 16; ++i) q[i] = f32_to_f16(v[i]);
#endif
}

inline void store_bf16_pairs(uint16_t* dst, vf row0, vf row1) {
  uint16_t a[16], b[16];
  to_bf16_bits(row0, a);
  to_bf16_bits(row1, b);
  for (int i = 0; i < 16; ++i) {
    dst[2 * i] = a[i];
    dst[2 * i + 1] = b[i];
  }
}

inline vf dot_bf16_pairs(vf acc, const uint32_t* a, const uint32_t* b) {
  vu_ wa, wb;
  std::memcpy(&wa, a, sizeof(wa));
  std::memcpy(&wb, b, sizeof(wb));
  const vu_ a_lo = wa << 16, a_hi = wa & 0xffff0000u, b_lo = wb << 16, b_hi = wb & 0xffff0000u;
  vf al, ah, bl, bh;
  std::memcpy(&al, &a_lo, sizeof(al));
  std::memcpy(&ah, &a_hi, sizeof(ah));
  std::memcpy(&bl, &b_lo, sizeof(bl));
  std::memcpy(&bh, &b_hi, sizeof(bh));
  return acc + al * bl + ah * bh;
}
inline vf dot_bf16_pairs(vf acc, uint32_t a, const uint32_t* b) {
  vu_ wb;
  std::memcpy(&wb, b, sizeof(wb));
  const vu_ b_lo = wb << 16, b_hi = wb & 0xffff0000u;
  vf bl, bh;
  std::memcpy(&bl, &b_lo, sizeof(bl));
  std::memcpy(&bh, &b_hi, sizeof(bh));
  return acc + set1(bf16_to_f32(static_cast<uint16_t>(a & 0xffffu))) * bl +
         set1(bf16_to_f32(static_cast<uint16_t>(a >> 16))) * bh;
}

#endif

}  // namespace moetron::kernels::cpu::simd
