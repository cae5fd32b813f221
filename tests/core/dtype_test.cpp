#include "moetron/core/dtype.h"
#include "moetron/core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace moetron {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even -> 1.0.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16RoundTripsAndRoundsToNearestEven) {
  for (float x : {0.0f, 1.0f, -2.0f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  }
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even -> 1.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                   // overflow to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of the smallest subnormal: even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp rounds to even 2
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, ParsesNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_THROW(parse_dtype("fp8"), Error);
}

}  // namespace
}  // namespace moetron
