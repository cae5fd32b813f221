#include "moetron/monitor/straggler.h"

#include <gtest/gtest.h>

#include "moetron/core/error.h"

namespace moetron::monitor {
namespace {

TEST(StragglerDetector, NamesARankSlowForKIntervalsAndClearsIt) {
  StragglerDetector d(0.2, 3);
  const std::vector<double> even = {1.0, 1.0, 1.05, 0.98};
  const std::vector<double> slow2 = {1.0, 1.0, 1.5, 0.98};
  EXPECT_TRUE(d.observe(even).empty());
  EXPECT_TRUE(d.observe(slow2).empty());
  EXPECT_TRUE(d.observe(slow2).empty());
  const auto named = d.observe(slow2);  // the third slow interval in a row
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 2);
  EXPECT_TRUE(named[0].straggling);
  EXPECT_NEAR(named[0].ratio, 1.5, 1e-12);
  EXPECT_TRUE(d.is_straggler(2));
  EXPECT_FALSE(d.is_straggler(1));
  EXPECT_TRUE(d.observe(slow2).empty());  // still slow: no new change
  const auto cleared = d.observe(even);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_FALSE(cleared[0].straggling);
  EXPECT_FALSE(d.is_straggler(2));
}

TEST(StragglerDetector, AnInterruptedRunStartsOver) {
  StragglerDetector d(0.2, 2);
  EXPECT_TRUE(d.observe({1.0, 2.0}).empty());  // two ranks: the faster is the reference
  EXPECT_TRUE(d.observe({1.0, 1.0}).empty());
  EXPECT_TRUE(d.observe({1.0, 2.0}).empty());
  EXPECT_EQ(d.observe({1.0, 2.0}).size(), 1u);
}

TEST(StragglerDetector, OneRankAndBadSettings) {
  StragglerDetector d(0.1, 1);
  EXPECT_TRUE(d.observe({5.0}).empty());
  EXPECT_THROW(StragglerDetector(0, 1), Error);
  EXPECT_THROW(StragglerDetector(0.1, 0), Error);
}

}  // namespace
}  // namespace moetron::monitor
