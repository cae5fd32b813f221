// The automatic end of compression's warm-up (train/compression_start.h):
// it waits for the earliest allowed step, never starts while the gradients'
// second moment still moves by more than the tolerance over its window,
// starts once it settles, ignores non-finite steps, and continues
// identically after a save and restore of its state.
#include "moetron/train/compression_start.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace moetron::train {
namespace {

CompressionStartOptions options(double beta2, double tol, int64_t min_steps, int64_t lr_warmup) {
  CompressionStartOptions o;
  o.beta2 = beta2;
  o.tolerance = tol;
  o.min_steps = min_steps;
  o.lr_warmup = lr_warmup;
  return o;
}

// The first step at which observe() says "start", feeding norm(t).
template <typename Norm>
int64_t first_start(CompressionStart& c, Norm norm, int64_t from = 1, int64_t to = 2000) {
  for (int64_t t = from; t <= to; ++t) {
    if (c.observe(t, norm(t))) return t;
  }
  return -1;
}

TEST(CompressionStart, AConstantNormStartsAtTheEarliestAllowedStep) {
  // beta2 0.95: window 20 steps, so never before step 40.
  CompressionStart c(options(0.95, 0.1, 0, 10));
  EXPECT_EQ(c.window(), 20);
  EXPECT_EQ(first_start(c, [](int64_t) { return 2.0; }), 40);
  EXPECT_NEAR(c.last_change(), 0.0, 1e-12);
  // A longer lr warm-up or minimum delays it to that step.
  CompressionStart late(options(0.95, 0.1, 0, 75));
  EXPECT_EQ(first_start(late, [](int64_t) { return 2.0; }), 75);
  CompressionStart later(options(0.95, 0.1, 90, 75));
  EXPECT_EQ(first_start(later, [](int64_t) { return 2.0; }), 90);
}

TEST(CompressionStart, WaitsWhileTheNormFallsThenStartsOnThePlateau) {
  // Falls by e per 15 steps until step 150, then flat: over a 20-step window
  // the squared norm's EMA changes by far more than 10% while it falls.
  const auto norm = [](int64_t t) {
    return 0.5 + 10.0 * std::exp(-static_cast<double>(std::min<int64_t>(t, 150)) / 15.0);
  };
  CompressionStart c(options(0.95, 0.1, 0, 0));
  const int64_t start = first_start(c, norm);
  EXPECT_GT(start, 40);
  // At the start the EMA's change over the window is within the tolerance,
  // one step before it was not.
  EXPECT_LE(c.last_change(), 0.1);
  CompressionStart again(options(0.95, 0.1, 0, 0));
  for (int64_t t = 1; t < start; ++t) EXPECT_FALSE(again.observe(t, norm(t))) << t;
  EXPECT_GT(again.last_change(), 0.1);
  // A tighter tolerance waits longer.
  CompressionStart tight(options(0.95, 0.01, 0, 0));
  EXPECT_GT(first_start(tight, norm), start);
}

TEST(CompressionStart, NonFiniteNormsAreNotObserved) {
  CompressionStart c(options(0.5, 0.1, 0, 0));  // window 2
  EXPECT_FALSE(c.observe(1, std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(c.observe(2, std::numeric_limits<double>::infinity()));
  // W + 1 = 3 finite observations are needed from here (and step >= 2 W = 4).
  EXPECT_FALSE(c.observe(3, 1.0));
  EXPECT_FALSE(c.observe(4, 1.0));
  EXPECT_TRUE(c.observe(5, 1.0));
}

TEST(CompressionStart, RestoredStateContinuesIdentically) {
  const auto norm = [](int64_t t) { return 1.0 + 5.0 / static_cast<double>(t); };
  CompressionStart whole(options(0.9, 0.05, 0, 0));
  const int64_t start = first_start(whole, norm);
  ASSERT_GT(start, 20);
  CompressionStart first(options(0.9, 0.05, 0, 0));
  for (int64_t t = 1; t <= 20; ++t) ASSERT_FALSE(first.observe(t, norm(t)));
  CompressionStart second(options(0.9, 0.05, 0, 0));
  second.from_json(nlohmann::json::parse(first.to_json().dump()));
  EXPECT_EQ(first_start(second, norm, 21), start);
  EXPECT_EQ(second.last_change(), whole.last_change());
}

}  // namespace
}  // namespace moetron::train
