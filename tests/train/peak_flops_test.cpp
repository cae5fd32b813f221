// MFU against a stable peak, never above 100% (train/peak_flops.h).
#include "moetron/train/peak_flops.h"

#include <gtest/gtest.h>

namespace moetron::train {
namespace {

TEST(PeakFlops, ThePeakIsTheFastestProbe) {
  // One probe in a noisy moment (0.5 s) must not lower the peak.
  EXPECT_DOUBLE_EQ(peak_from_probes({0.5, 0.1, 0.2, 0.1}, 1e9), 1e10);
  EXPECT_DOUBLE_EQ(peak_from_probes({0.25}, 1e9), 4e9);
}

TEST(PeakFlops, MfuNeverExceedsOne) {
  EXPECT_DOUBLE_EQ(model_flops_utilization(100, 1e6, 1e9, 1), 0.1);
  EXPECT_DOUBLE_EQ(model_flops_utilization(100, 1e6, 1e8, 4), 0.25);
  EXPECT_DOUBLE_EQ(model_flops_utilization(1100, 1e6, 1e9, 1), 1.0);  // 110%: noise, reported 1
  EXPECT_DOUBLE_EQ(model_flops_utilization(100, 1e6, 0, 1), 0.0);     // no peak measured
}

TEST(PeakFlops, TheMeasuredPeakIsPositive) {
  const double a = measure_peak_flops(DType::f32, 1);
  EXPECT_GT(a, 0);
}

}  // namespace
}  // namespace moetron::train
