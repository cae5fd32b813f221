// 16-lane load/store of f32 or bf16 storage as f32 vectors (simd.h), with a
// lane mask so one loop body covers a row's full vectors and its tail
// (masked loads/stores cost the same as plain ones with AVX-512, and the
// tail needs no scalar copy of the math). Used by the pointwise CPU kernels
// (norm, activation, rope, embedding, adamw).
#pragma once

#include <cstdint>

#include "moetron/core/dtype.h"
#include "moetron/core/error.h"
#include "moetron/kernels/cpu/simd.h"
#include "moetron/kernels/cpu/vec_math.h"

namespace moetron::kernels::cpu {

// Lanes [0, n) set, n clamped to 16.
inline simd::mask16 lane_mask(int64_t n) {
  return simd::first_lanes(n);
}

// Masked-off lanes read as 0.
inline simd::vf load16(const float* p, simd::mask16 m) {
  return simd::load(p, m);
}
inline simd::vf load16(const bf16* p, simd::mask16 m) {
  return simd::load(p, m);
}
inline void store16(float* p, simd::vf v, simd::mask16 m) {
  simd::store(p, v, m);
}
// Rounds to nearest even, NaN stays NaN.
inline void store16(bf16* p, simd::vf v, simd::mask16 m) {
  simd::store(p, v, m);
}

// Calls fn(float{}) or fn(bf16{}) for the storage type of a CPU float tensor.
template <typename Fn>
decltype(auto) dispatch_f32_bf16(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::bf16:
      return fn(bf16{});
    default:
      break;
  }
  MOETRON_FAIL(what, ": the CPU backend takes f32 or bf16, got ", dtype_name(dtype));
}

}  // namespace moetron::kernels::cpu
