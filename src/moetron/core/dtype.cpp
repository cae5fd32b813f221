#include "moetron/core/dtype.h"

#include <cmath>

#include "moetron/core/error.h"

namespace moetron {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType t :
       {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64, DType::u8}) {
    if (dtype_name(t) == name) return t;
  }
  MOETRON_FAIL("unknown dtype '", name, "' (expected f32, bf16, f16, f64, i32, i64 or u8)");
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal half: value = mant * 2^-24, exact in f32
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in f16: round |f| * 2^24 to an integer, ties to even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;    // exact: power-of-two scaling
    const float r = std::nearbyint(scaled);  // default rounding mode is to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  // Normal: rebias exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t v = abs - (112u << 23);
  const uint32_t lsb = (v >> 13) & 1u;
  v += 0xfffu + lsb;
  return static_cast<uint16_t>(sign | (v >> 13));
}

}  // namespace moetron
