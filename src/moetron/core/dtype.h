// Element types and the scalar conversions every backend agrees on.
// bf16 and f16 are stored as raw 16-bit patterns; conversions from f32 round
// to nearest, ties to even, and keep NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace moetron {

// f64 exists for the reference backend and finite-difference tests; the
// training path uses f32/bf16/f16 for floats and i32/i64/u8 for indices/bytes.
enum class DType : uint8_t { f32, bf16, f16, f64, i32, i64, u8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

std::string_view dtype_name(DType t);
// Parses "f32", "bf16", "f16", "f64", "i32", "i64", "u8"; throws naming the value.
DType parse_dtype(std::string_view name);

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace moetron
