// Building blocks of the CPU attention kernels: tile sizes, packing of
// [rows x head_dim] slices of q/k/v/dout into the layouts the 16-lane
// micro-kernels read (simd.h), the micro-kernels themselves (f32 FMA, bf16
// pair dot products: AVX512-BF16's dpbf16 where present), and the tile-level mask (classification
// of a whole Bq x Bk tile, and the per-row visibility bits of a boundary tile).
//
// Storage types: `float` for f32 tensors, `uint16_t` (bf16 bits) for bf16.
// The bf16 micro-kernel consumes the reduction dimension in pairs (kPack = 2):
// its B operand is packed as [K/2][N][2] so one 512-bit load holds 16 columns
// of two consecutive k, and its A operand is read one (k, k+1) pair (32 bits)
// at a time and broadcast. The f32 kernel uses kPack = 1 ([K][N]).
// Every packed tile is zero-padded to full tile sizes (rows to kBq/kBk,
// head_dim to a multiple of 16), so the kernels run only full tiles; padding
// contributes zeros to every product and padded keys are masked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "moetron/kernels/attention.h"
#include "moetron/kernels/cpu/simd.h"

namespace moetron::kernels::cpu::attn {

constexpr int64_t kBq = 64;  // query rows per tile
constexpr int64_t kBk = 64;  // key rows per tile
constexpr int kMr = 4;       // micro-kernel rows (4 x 64 columns = 16 accumulators)

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
inline int64_t ceil_div(int64_t x, int64_t m) {
  return (x + m - 1) / m;
}

template <typename T>
constexpr int kPack = sizeof(T) == 2 ? 2 : 1;

// dst[r][c] = src[r * ld + c] for r < rows, c < cols; zero elsewhere up to
// R x C: a tile of q/k/v/dout (row stride H * hd in the tensor) made dense.
template <typename T>
void pack_rows(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    T* d = dst + r * C;
    if (r < rows) {
      std::memcpy(d, src + r * ld, static_cast<size_t>(cols) * sizeof(T));
      std::memset(d + cols, 0, static_cast<size_t>(C - cols) * sizeof(T));
    } else {
      std::memset(d, 0, static_cast<size_t>(C) * sizeof(T));
    }
  }
}

// The packed layouts below are built from a padded row-major tile (pack_rows
// output, R x C with R a multiple of 16 and C of 16) with full vectors only.

// B operand whose reduction index is the tile row: dst[r / P][c][P] (an
// R x C tile). For f32 (P = 1) this is the row-major tile itself; for bf16
// rows r and r + 1 are interleaved element by element. Used for V in P V,
// dout in P^T dO, q in dS^T Q and k in dS K.
template <typename T>
void pack_kn(const T* rm, int64_t R, int64_t C, T* dst) {
  if constexpr (kPack<T> == 1) {
    std::memcpy(dst, rm, static_cast<size_t>(R * C) * sizeof(T));
  } else {
#if MOETRON_SIMD_AVX512
    alignas(64) static constexpr uint16_t kIdx[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                      37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                      11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_load_si512(kIdx);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t r = 0; r < R; r += 2) {
      const T* r0 = rm + r * C;
      const T* r1 = r0 + C;
      T* d = dst + r * C;
      for (int64_t c = 0; c < C; c += 32) {
        // 32 columns of two rows become 32 (row0, row1) pairs = two vectors.
        // The tail of a C that is 16 mod 32 uses the low half only.
        const bool full = c + 32 <= C;
        const __mmask32 m = full ? ~__mmask32{0} : __mmask32{0xffff};
        const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + c);
        const __m512i b = _mm512_maskz_loadu_epi16(m, r1 + c);
        _mm512_storeu_si512(d + 2 * c, _mm512_permutex2var_epi16(a, lo, b));
        if (full) _mm512_storeu_si512(d + 2 * c + 32, _mm512_permutex2var_epi16(a, hi, b));
      }
    }
#else
    for (int64_t r = 0; r < R; r += 2) {
      const T* r0 = rm + r * C;
      const T* r1 = r0 + C;
      T* d = dst + r * C;
      for (int64_t c = 0; c < C; ++c) {
        d[2 * c] = r0[c];
        d[2 * c + 1] = r1[c];
      }
    }
#endif
  }
}

// B operand whose reduction index is the tile column (a transpose):
// dst[c / P][r][P] for an R x C tile. Both dtypes move 32-bit words (an f32,
// or a bf16 pair), gathered 16 rows at a time. Used for k in Q K^T and v in
// dO V^T.
template <typename T>
void pack_nk(const T* rm, int64_t R, int64_t C, T* dst) {
  constexpr int P = kPack<T>;
  const int64_t W = C / P;  // 32-bit words per row
  const auto* src = reinterpret_cast<const int*>(rm);
  auto* out = reinterpret_cast<int*>(dst);
#if MOETRON_SIMD_AVX512
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(W)));
  for (int64_t r = 0; r < R; r += 16) {
    for (int64_t w = 0; w < W; ++w) {
      _mm512_storeu_si512(out + w * R + r, _mm512_i32gather_epi32(rows, src + r * W + w, 4));
    }
  }
#else
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) out[w * R + r] = src[r * W + w];
#endif
}

// C[MR x 16 NV] (+)= A[MR x K] B[K x 16 NV] in f32. A(r, k) = a[r * a_rs + k * a_ks];
// B row k starts at b + k * b_ks.
template <int MR, int NV>
inline void micro_f32(const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t b_ks,
                      int64_t K, float* c, int64_t ldc, bool accumulate) {
  simd::vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? simd::load(c + r * ldc + 16 * v) : simd::zero();
  for (int64_t k = 0; k < K; ++k) {
    simd::vf bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = simd::load(b + k * b_ks + 16 * v);
    for (int r = 0; r < MR; ++r) {
      const simd::vf av = simd::set1(a[r * a_rs + k * a_ks]);
      for (int v = 0; v < NV; ++v) acc[r][v] = simd::fmadd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) simd::store(c + r * ldc + 16 * v, acc[r][v]);
}

// Same in bf16 with f32 accumulation: k runs over pairs. A(r, pair kp) is the
// 32-bit word a[r * a_rs + kp * a_ks] holding (A[r][2kp], A[r][2kp+1]); B pair
// row kp starts at b + kp * b_ks (uint16 units) and holds [16 NV][2].
template <int MR, int NV>
inline void micro_bf16(const uint32_t* a, int64_t a_rs, int64_t a_ks, const uint16_t* b,
                       int64_t b_ks, int64_t KP, float* c, int64_t ldc, bool accumulate) {
  simd::vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? simd::load(c + r * ldc + 16 * v) : simd::zero();
  for (int64_t kp = 0; kp < KP; ++kp) {
    const auto* bw = reinterpret_cast<const uint32_t*>(b + kp * b_ks);
    for (int r = 0; r < MR; ++r) {
      const uint32_t aw = a[r * a_rs + kp * a_ks];
      for (int v = 0; v < NV; ++v) acc[r][v] = simd::dot_bf16_pairs(acc[r][v], aw, bw + 16 * v);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) simd::store(c + r * ldc + 16 * v, acc[r][v]);
}

template <typename T, int NV>
inline void micro(const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t b_ks, int64_t K,
                  float* c, int64_t ldc, bool accumulate) {
  if constexpr (kPack<T> == 1) {
    micro_f32<kMr, NV>(a, a_rs, a_ks, b, b_ks, K, c, ldc, accumulate);
  } else {
    micro_bf16<kMr, NV>(reinterpret_cast<const uint32_t*>(a), a_rs, a_ks, b, b_ks, K / 2, c, ldc,
                        accumulate);
  }
}

// C[M x N] (+)= A[M x K] B[K x N] over a whole tile: M a multiple of kMr, N of
// 16, K of kPack. A strides count k-groups (floats, or bf16 pairs); B is
// packed [K / P][N][P] so b_ks = N * P.
template <typename T>
void gemm_tile(const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t M, int64_t N, int64_t K,
               float* c, int64_t ldc, bool accumulate) {
  constexpr int P = kPack<T>;
  const int64_t b_ks = N * P;
  for (int64_t r0 = 0; r0 < M; r0 += kMr) {
    const T* ar = a + r0 * a_rs * P;  // a_rs counts k-groups of P elements
    float* cr = c + r0 * ldc;
    int64_t n0 = 0;
    for (; n0 + 64 <= N; n0 += 64) {
      micro<T, 4>(ar, a_rs, a_ks, b + n0 * P, b_ks, K, cr + n0, ldc, accumulate);
    }
    switch ((N - n0) / 16) {
      case 3:
        micro<T, 3>(ar, a_rs, a_ks, b + n0 * P, b_ks, K, cr + n0, ldc, accumulate);
        break;
      case 2:
        micro<T, 2>(ar, a_rs, a_ks, b + n0 * P, b_ks, K, cr + n0, ldc, accumulate);
        break;
      case 1:
        micro<T, 1>(ar, a_rs, a_ks, b + n0 * P, b_ks, K, cr + n0, ldc, accumulate);
        break;
      default:
        break;
    }
  }
}

enum class TileKind { empty, full, partial };

// Whether the tile of query rows [i0, i0 + kBq) and keys [j0, j0 + kBk) has
// no visible pair (skipped), only visible pairs (no elementwise mask), or a
// mix, under a mask of one sequence (sequence_mask). `empty` is
// exact-or-conservative and `full` is only claimed when every pair is
// visible, so a misjudged tile costs time, never correctness. Document
// starts never decrease, so the tile's first and last rows bound them.
inline TileKind classify_tile(const AttentionMask& m, int64_t i0, int64_t j0, int64_t Sq,
                              int64_t Sk) {
  const int64_t p0 = m.q_offset + i0, p1 = m.q_offset + std::min(i0 + kBq, Sq) - 1;
  const int64_t ja = j0, jb = std::min(j0 + kBk, Sk) - 1;
  const bool padded = j0 + kBk > Sk;
  const bool any_c = !m.causal || ja <= p1, all_c = !m.causal || jb <= p0;
  const int64_t s0 = document_start(m, p0), s1 = document_start(m, p1);
  const bool any_doc = jb >= s0, all_doc = ja >= s1;
  if (!any_c || !any_doc) return TileKind::empty;
  if (m.window <= 0) return all_c && all_doc && !padded ? TileKind::full : TileKind::partial;
  // Global pairs: a key among its document's first g positions, or a query
  // among them (some row may open a new document when s0 != s1).
  const int64_t g = m.num_global;
  const bool any_g = ja - s1 < g || s0 != s1 || p0 - s0 < g;
  const bool all_g = jb - s0 < g || (s0 == s1 && p1 - s0 < g);
  int64_t min_d, max_d;
  if (m.causal) {
    min_d = std::max<int64_t>(0, p0 - jb);
    max_d = p1 - ja;
  } else {
    min_d = std::max<int64_t>({0, p0 - jb, ja - p1});
    max_d = std::max(p1 - ja, jb - p0);
  }
  const bool any_w = min_d < m.window, all_w = max_d < m.window;
  if (!any_w && !any_g) return TileKind::empty;
  return all_c && all_doc && (all_w || all_g) && !padded ? TileKind::full : TileKind::partial;
}

// Visibility bits of keys j0 .. j0 + 15 from absolute query position p:
// attention_visible() on 16 lanes (a mask of one sequence), plus j < Sk.
inline simd::mask16 visible16(const AttentionMask& m, int64_t p, int64_t j0, int64_t Sk) {
  // A padded query row may lie past the last query position the document
  // starts cover: its bits are discarded.
  const int64_t s = m.doc_start ? document_start(m, std::min(p, m.doc_stride - 1)) : 0;
#if MOETRON_SIMD_AVX512
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j0)), iota);
  const __m512i pv = _mm512_set1_epi32(static_cast<int>(p));
  __mmask16 ok = _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(Sk)));
  if (m.causal) ok &= _mm512_cmple_epi32_mask(j, pv);
  if (s > 0) ok &= _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(s)));
  if (m.window > 0 && p - s >= m.num_global) {
    __m512i dist = _mm512_sub_epi32(pv, j);
    if (!m.causal) dist = _mm512_abs_epi32(dist);
    const __mmask16 near =
        _mm512_cmplt_epi32_mask(dist, _mm512_set1_epi32(static_cast<int>(m.window)));
    const __mmask16 global =
        _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(s + m.num_global)));
    ok &= static_cast<__mmask16>(near | global);
  }
  return ok;
#else
  simd::mask16 ok = 0;
  for (int i = 0; i < 16; ++i) {
    const int64_t j = j0 + i;
    bool vis = j < Sk && (!m.causal || j <= p) && j >= s;
    if (vis && m.window > 0 && p - s >= m.num_global) {
      const int64_t dist = m.causal ? p - j : (p > j ? p - j : j - p);
      vis = dist < m.window || j - s < m.num_global;
    }
    ok = static_cast<simd::mask16>(ok | (vis ? 1u : 0u) << i);
  }
  return ok;
#endif
}

// Stores the first n of 16 floats as T.
template <typename T>
inline void store_f32_as(T* dst, simd::vf v, int n) {
  const simd::mask16 mk = simd::first_lanes(n);
  if constexpr (kPack<T> == 1) {
    simd::store(dst, v, mk);
  } else {
    simd::store(reinterpret_cast<bf16*>(dst), v, mk);
  }
}

// Loads the first n of 16 elements of T as floats (rest zero).
template <typename T>
inline simd::vf load_as_f32(const T* src, int n) {
  const simd::mask16 mk = simd::first_lanes(n);
  if constexpr (kPack<T> == 1) {
    return simd::load(src, mk);
  } else {
    return simd::load(reinterpret_cast<const bf16*>(src), mk);
  }
}

}  // namespace moetron::kernels::cpu::attn
