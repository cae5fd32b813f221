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

// The magnitude code of y in [0, max_magnitude]: normal values by their
// bits (exponent, kept mantissa, random bits added below it), subnormal
// ones in integer steps of the smallest normal binade's spacing.
inline uint32_t magnitude_code(float y, uint32_t random, const CodeFormat& f) {
  const uint32_t dropped = 23 - static_cast<uint32_t>(f.mantissa_bits);
  const uint32_t mask = (1u << dropped) - 1;
  uint32_t u;
  std::memcpy(&u, &y, 4);
  if (static_cast<int>(u >> 23) - 127 + f.bias() >= 1) {
    const uint32_t r = u + (random & mask);
    const int e = static_cast<int>(r >> 23) - 127 + f.bias();
    const uint32_t c = (static_cast<uint32_t>(e) << f.mantissa_bits) |
                       ((r >> dropped) & ((1u << f.mantissa_bits) - 1));
    return std::min(c, static_cast<uint32_t>(f.top()));
  }
  const float t = std::ldexp(y, f.bias() + f.mantissa_bits - 1);
  const float frac =
      static_cast<float>(random & mask) * std::ldexp(1.0f, -static_cast<int>(dropped));
  return static_cast<uint32_t>(t + frac);  // exact: t < 2^mantissa, frac has `dropped` bits
}

// rel = x / (its block's largest |x|), in [-1, 1].
inline uint8_t encode(StateCode code, float rel, uint32_t random) {
  const CodeFormat f = code_format(code);
  const float y = std::fabs(rel) * f.max_magnitude();
  const uint32_t c = magnitude_code(y, random, f);
  if (f.is_signed) return static_cast<uint8_t>(c | (rel < 0 && c != 0 ? 128u : 0u));
  return static_cast<uint8_t>(c == 0 && y > 0 ? 1 : c);  // sqrt(v) > 0 never decodes to 0
}

// Encodes vals[0, len) of block b (element index b * kStateBlock + j). The
// division by the block's maximum (not a multiply by its inverse) keeps
// that value's rel at exactly 1: it encodes to the top code and decodes to
// the scale itself.
inline void encode_block(StateCode code, const float* vals, int64_t len, int64_t b, uint8_t* codes,
                         float* scales, uint32_t key) {
  float amax = 0;
  for (int64_t j = 0; j < len; ++j) amax = std::max(amax, std::fabs(vals[j]));
  scales[b] = amax;
  const int64_t base = b * kStateBlock;
  for (int64_t j = 0; j < len; ++j) {
    codes[base + j] =
        amax > 0 ? encode(code, vals[j] / amax, rounding_bits(key, static_cast<uint32_t>(base + j)))
                 : 0;
  }
}

inline void decode_block(const Table& t, const uint8_t* codes, float scale, int64_t len,
                         float* out) {
  for (int64_t j = 0; j < len; ++j) out[j] = t[codes[j]] * scale;
}

}  // namespace moetron::kernels::cpu
