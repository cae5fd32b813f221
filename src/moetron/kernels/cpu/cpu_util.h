// Shared pieces of the CPU backend: scalar load/store per dtype written so
// the compiler vectorises loops over them, and dtype dispatch for float tensors.
#pragma once

#include <cstdint>
#include <cstring>

#include "moetron/core/dtype.h"
#include "moetron/core/error.h"
#include "moetron/core/tensor.h"

namespace moetron::kernels::cpu {

inline float to_f32(float x) {
  return x;
}
inline float to_f32(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float to_f32(f16 x) {
  return f16_to_f32(x.bits);
}

template <typename T>
inline T from_f32(float x);
template <>
inline float from_f32<float>(float x) {
  return x;
}
template <>
inline bf16 from_f32<bf16>(float x) {
  return bf16{f32_to_bf16(x)};
}
template <>
inline f16 from_f32<f16>(float x) {
  return f16{f32_to_f16(x)};
}

// Calls fn(T{}) with T the C++ type of a float tensor's dtype (f32, bf16, f16).
template <typename Fn>
decltype(auto) dispatch_float(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::bf16:
      return fn(bf16{});
    case DType::f16:
      return fn(f16{});
    default:
      break;
  }
  MOETRON_FAIL(what, ": the CPU backend takes f32, bf16 or f16, got ", dtype_name(dtype));
}

template <typename T>
inline T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

}  // namespace moetron::kernels::cpu
