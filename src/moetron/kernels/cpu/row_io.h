// 16-lane loads and stores of f32 or bf16 rows as f32 vectors (simd.h),
// with a tail for row lengths that are not a multiple of 16 (used by the
// MoE and cross-entropy CPU kernels).
#pragma once

#include <cstdint>

#include "moetron/core/dtype.h"
#include "moetron/kernels/cpu/simd.h"
#include "moetron/kernels/cpu/vec_math.h"

namespace moetron::kernels::cpu::row_io {

inline simd::mask16 tail_mask(int64_t n) {
  return simd::first_lanes(n);
}

// The first min(n, 16) elements at p as f32; lanes past n are 0.
inline simd::vf load16(const float* p, int64_t n) {
  return n >= 16 ? simd::load(p) : simd::load(p, tail_mask(n));
}
inline simd::vf load16(const bf16* p, int64_t n) {
  return n >= 16 ? simd::load(p) : simd::load(p, tail_mask(n));
}
// Lanes past n read `fill` instead (e.g. -inf for a max or a softmax).
template <typename T>
inline simd::vf load16_or(const T* p, int64_t n, simd::vf fill) {
  return n >= 16 ? load16(p, n) : simd::blend(tail_mask(n), fill, load16(p, n));
}

// Stores the first min(n, 16) lanes (bf16: rounded to nearest even).
template <typename T>
inline void store16(T* p, simd::vf v, int64_t n) {
  if (n >= 16) {
    simd::store(p, v);
  } else {
    simd::store(p, v, tail_mask(n));
  }
}

}  // namespace moetron::kernels::cpu::row_io
