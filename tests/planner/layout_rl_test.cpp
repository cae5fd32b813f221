// The reinforcement-learning layout search against the exhaustive one on
// spaces small enough for both: the result is within 2% of the optimum's
// step time (the target) from a fraction of its evaluations, the
// trained policy beats uniform sampling at the same number of
// evaluations, and a seed reproduces its search.
#include "moetron/planner/layout_rl.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "util/preset_model.h"

namespace moetron::planner {
namespace {

CostModel mixtral_on_h200(int64_t devices_per_node) {
  return test::preset_model("mixtral-8x7b", "h200", devices_per_node);
}

TEST(RlSearch, WithinTwoPercentOfTheExhaustiveOptimumFromAFractionOfItsEvaluations) {
  const CostModel model = mixtral_on_h200(8);
  for (const int64_t devices : {64, 512, 1024}) {
    const SearchResult ex = search_layouts(model, devices, 1);
    ASSERT_FALSE(ex.plans.empty());
    const double optimum = ex.plans.front().cost.step_s;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      RlOptions o;
      o.seed = seed;
      const RlResult rl = rl_search_layouts(model, devices, {}, o);
      ASSERT_TRUE(rl.found);
      EXPECT_LE(rl.best.cost.step_s, 1.02 * optimum)
          << devices << " devices, seed " << seed << ": " << rl.best.layout.str() << " vs "
          << ex.plans.front().layout.str();
      EXPECT_GE(rl.best.cost.step_s, optimum * (1 - 1e-12));  // nothing beats the optimum
      EXPECT_LT(rl.evaluations, ex.evaluated / 3) << devices << " devices, seed " << seed;
      EXPECT_LE(rl.best.cost.step_s, rl.policy_step_s);  // the polish never makes it worse
      std::printf("%lld devices seed %llu: policy %+.2f%%, polished %+.2f%%, %lld of %lld\n",
                  static_cast<long long>(devices), static_cast<unsigned long long>(seed),
                  100 * (rl.policy_step_s / optimum - 1), 100 * (rl.best.cost.step_s / optimum - 1),
                  static_cast<long long>(rl.evaluations), static_cast<long long>(ex.evaluated));
    }
  }
}

TEST(RlSearch, TheTrainedPolicyBeatsUniformSamplingAtEqualEvaluations) {
  const CostModel model = mixtral_on_h200(8);
  const int64_t devices = 1024;
  const double optimum = search_layouts(model, devices, 1).plans.front().cost.step_s;
  double policy_gap = 0, uniform_gap = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    RlOptions o;
    o.seed = seed;
    o.polish = false;
    const RlResult rl = rl_search_layouts(model, devices, {}, o);
    // A policy that never learns (learning rate 0) samples uniformly among
    // the layouts that cover the cluster; stop it at the same evaluations.
    RlOptions u = o;
    u.learning_rate = 0;
    u.max_samples = 100 * rl.evaluations;
    u.max_evaluations = rl.policy_evaluations;
    const RlResult uniform = rl_search_layouts(model, devices, {}, u);
    ASSERT_EQ(uniform.evaluations, rl.policy_evaluations);
    policy_gap += rl.policy_step_s / optimum - 1;
    uniform_gap += uniform.policy_step_s / optimum - 1;
    std::printf("seed %llu: policy %+.2f%% (%lld evaluations), uniform %+.2f%% (%lld)\n",
                static_cast<unsigned long long>(seed), 100 * (rl.policy_step_s / optimum - 1),
                static_cast<long long>(rl.policy_evaluations),
                100 * (uniform.policy_step_s / optimum - 1),
                static_cast<long long>(uniform.evaluations));
  }
  EXPECT_LT(policy_gap, uniform_gap);
}

TEST(RlSearch, ASeedReproducesItsSearch) {
  const CostModel model = mixtral_on_h200(8);
  RlOptions o;
  o.seed = 7;
  const RlResult a = rl_search_layouts(model, 256, {}, o), b = rl_search_layouts(model, 256, {}, o);
  EXPECT_EQ(a.best.layout.str(), b.best.layout.str());
  EXPECT_EQ(a.evaluations, b.evaluations);
  EXPECT_EQ(a.best_by_update, b.best_by_update);
  RlOptions bad = o;
  bad.batch = 1;
  EXPECT_THROW(rl_search_layouts(model, 256, {}, bad), std::exception);
}

}  // namespace
}  // namespace moetron::planner
