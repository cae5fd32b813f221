// When a run has diverged: consecutive skips, a fraction of recent skips,
// and loss spikes (train/divergence_guard.h).
#include "moetron/train/divergence_guard.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moetron::train {
namespace {

TEST(DivergenceGuard, ConsecutiveSkipsStopTheRun) {
  DivergenceGuard g({3, 0, 0});
  int64_t step = 0;
  for (int i = 0; i < 5; ++i) g.record(++step, 2.0, false);
  g.record(++step, NAN, true);
  g.record(++step, NAN, true);
  g.record(++step, 2.0, false);  // a good step resets the count
  g.record(++step, NAN, true);
  g.record(++step, NAN, true);
  EXPECT_TRUE(g.stop_reason().empty()) << g.stop_reason();
  g.record(++step, NAN, true);
  EXPECT_NE(g.stop_reason().find("3 consecutive steps skipped"), std::string::npos)
      << g.stop_reason();
  EXPECT_NE(g.stop_reason().find("up to step 11"), std::string::npos) << g.stop_reason();
  EXPECT_NE(g.stop_reason().find("train.max_skipped_steps = 3"), std::string::npos);
}

TEST(DivergenceGuard, AFractionOfRecentSkipsStopsTheRun) {
  // 29 of 30 steps skipped, never 3 in a row... here every other step: 10 of 20.
  DivergenceGuard g({0, 0.4, 0});
  for (int64_t s = 1; s <= DivergenceGuard::kWindow; ++s) {
    g.record(s, 2.0, s % 2 == 0);
    if (s < DivergenceGuard::kWindow) {
      EXPECT_TRUE(g.stop_reason().empty()) << s;
    }
  }
  EXPECT_NE(g.stop_reason().find("10 of the last 20 steps were skipped"), std::string::npos)
      << g.stop_reason();
  DivergenceGuard off({0, 0, 0});
  for (int64_t s = 1; s <= 40; ++s) off.record(s, NAN, true);
  EXPECT_TRUE(off.stop_reason().empty());
}

TEST(DivergenceGuard, AnExplodingFiniteLossIsFlaggedAndCounted) {
  DivergenceGuard g({10, 0.5, 4.0});
  for (int64_t s = 1; s <= 5; ++s) EXPECT_FALSE(g.record(s, 5.0 - 0.1 * s, false));
  EXPECT_FALSE(g.record(6, 9.0, false));  // below 4 x the recent mean
  EXPECT_TRUE(g.record(7, 5e5, false));
  EXPECT_TRUE(g.record(8, 4e5, false));  // still far above the range before the spike
  EXPECT_EQ(g.spikes(), 2);
  EXPECT_TRUE(g.stop_reason().empty());  // flagged, not stopped
  // lr = 1e3: the loss explodes after one good step while the gradients
  // overflow (skipped); the finite loss is flagged all the same.
  DivergenceGuard h({10, 0.5, 4.0});
  EXPECT_FALSE(h.record(1, 5.77, false));
  EXPECT_TRUE(h.record(2, 425947.6, true));
  EXPECT_EQ(h.spikes(), 1);
  EXPECT_EQ(h.consecutive_skips(), 1);
}

}  // namespace
}  // namespace moetron::train
