#include "moetron/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moetron {
namespace {

TEST(Philox, MatchesRandom123KnownAnswers) {
  // Known-answer vectors for philox4x32_10 from the Random123 distribution.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, ShardInitialisedAloneEqualsSliceOfFullTensor) {
  const int64_t rows = 37, cols = 29;
  Tensor full = Tensor::empty({rows, cols}, DType::f32);
  fill_normal(full, 7, "layers.3.w1", 0.0f, 0.02f);
  // Row shard (as a row-parallel rank would hold).
  Tensor rows_shard = Tensor::empty({10, cols}, DType::f32);
  fill_normal(rows_shard, 7, "layers.3.w1", 0.0f, 0.02f, 12 * cols);
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(rows_shard.data<float>()[r * cols + c], full.data<float>()[(12 + r) * cols + c]);
  // Column block (as a column-parallel rank would hold).
  Tensor block = Tensor::empty({rows, 8}, DType::f32);
  fill_normal_block(block, 7, "layers.3.w1", 0.0f, 0.02f, cols, 0, 20);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 8; ++c)
      ASSERT_EQ(block.data<float>()[r * 8 + c], full.data<float>()[r * cols + 20 + c]);
}

TEST(Philox, NamesAndSeedsGiveIndependentStreamsWithRightMoments) {
  Tensor a = Tensor::empty({20000}, DType::f32);
  Tensor b = Tensor::empty({20000}, DType::f32);
  fill_normal(a, 1, "a", 0.0f, 1.0f);
  fill_normal(b, 1, "b", 0.0f, 1.0f);
  double mean = 0, var = 0, cross = 0;
  for (int i = 0; i < 20000; ++i) {
    mean += a.data<float>()[i];
    var += a.data<float>()[i] * a.data<float>()[i];
    cross += a.data<float>()[i] * b.data<float>()[i];
  }
  mean /= 20000;
  var = var / 20000 - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.04);
  EXPECT_NEAR(cross / 20000, 0.0, 0.03);
  Tensor u = Tensor::empty({20000}, DType::f32);
  fill_uniform(u, 1, "u", -2.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) {
    ASSERT_GE(u.data<float>()[i], -2.0f);
    ASSERT_LT(u.data<float>()[i], 2.0f);
  }
}

TEST(Philox, StreamIsResumableFromItsPosition) {
  PhiloxStream s(3, "sampler");
  for (int i = 0; i < 5; ++i) s.next_u32();
  PhiloxStream t(3, "sampler");
  t.set_position(s.position());
  for (int i = 0; i < 9; ++i) EXPECT_EQ(s.next_u32(), t.next_u32());
}

}  // namespace
}  // namespace moetron
