#include "moetron/optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace moetron::optim {
namespace {

TEST(LossScaler, HalvesAndSkipsOnOverflowDoublesAfterTheWindow) {
  LossScaler s(65536.0, 3);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_FALSE(s.update(false));  // overflow: skip, halve
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.overflow_steps(), 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_TRUE(s.update(true));  // third clean step in a row: double
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.clean_steps(), 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // an overflow resets the clean run
  EXPECT_EQ(s.clean_steps(), 0);
  EXPECT_EQ(s.scale(), 32768.0);
}

}  // namespace
}  // namespace moetron::optim
