// The pipeline schedules as op lists: every (micro-batch, chunk) runs forward
// once and backward once, in an order that cannot deadlock when each
// receive blocks, and an event simulation of them (forward 1, backward 2
// time units per layer chunk) idles (pp-1)/(v m + pp-1) of the time.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "moetron/core/error.h"
#include "moetron/nn/flops.h"
#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::parallel {
namespace {

// Makespan of the library's event simulation (time units), or -1 on deadlock.
double simulate(const std::string& kind, int64_t pp, int64_t m, int64_t v) {
  try {
    return simulate_schedule(parse_schedule(kind), pp, m, v);
  } catch (const Error&) {
    return -1;
  }
}

TEST(PipelineSchedule, EveryMicroBatchOnceForwardBeforeBackward) {
  for (const std::string kind : {"gpipe", "1f1b"}) {
    for (int64_t pp : {2, 3, 4}) {
      for (int64_t v : {1, 2, 3}) {
        for (int64_t m : {pp, 2 * pp, 3 * pp}) {
          for (int64_t r = 0; r < pp; ++r) {
            const auto ops = pipeline_schedule(kind, pp, r, m, v);
            ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m * v)) << kind << pp << v << m;
            std::set<std::pair<int64_t, int64_t>> fwd, bwd;
            int64_t in_flight = 0, most = 0;
            for (const PipeOp& op : ops) {
              ASSERT_TRUE(op.mb >= 0 && op.mb < m && op.chunk >= 0 && op.chunk < v);
              if (op.forward) {
                EXPECT_TRUE(fwd.insert({op.mb, op.chunk}).second);
                most = std::max(most, ++in_flight);
              } else {
                EXPECT_TRUE(fwd.count({op.mb, op.chunk})) << "backward before forward";
                EXPECT_TRUE(bwd.insert({op.mb, op.chunk}).second);
                --in_flight;
              }
            }
            // 1F1B bounds the micro-batches in flight by the stages (activation memory).
            if (kind == "1f1b" && v == 1) {
              EXPECT_LE(most, pp - r) << "rank " << r;
            }
            if (kind == "gpipe") {
              EXPECT_EQ(most, m * v);
            }
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, NoDeadlockAndTheBubbleOfTheFormula) {
  for (const std::string kind : {"gpipe", "1f1b"}) {
    for (int64_t pp : {2, 4}) {
      for (int64_t v : {1, 2}) {
        for (int64_t m : {pp, 2 * pp, 4 * pp}) {
          const double end = simulate(kind, pp, m, v);
          ASSERT_GT(end, 0) << kind << " deadlocks at pp " << pp << " v " << v << " m " << m;
          const double busy = static_cast<double>(m) * 3.0;  // per rank: m micro-batches x (1 + 2)
          const double bubble = 1.0 - busy / end;
          const double want = ideal_bubble_fraction(pp, m, v);
          if (kind == "1f1b") {
            EXPECT_NEAR(bubble, want, 1e-9) << "pp " << pp << " v " << v << " m " << m;
          } else {
            EXPECT_GE(bubble, want - 1e-9) << "gpipe, pp " << pp << " v " << v << " m " << m;
          }
        }
      }
    }
  }
}

// Stages cover the layers in order, one at least each, and no other split
// has a cheaper most-expensive stage (checked exhaustively for pp 2 and 3).
TEST(PipelineSchedule, BalancedStagesMinimiseTheLargestStage) {
  nn::ModelConfig m;
  m.n_layers = 7;
  m.vocab_size = 32000;  // a heavy head: the last stage should get fewer layers
  nn::MoeConfig e;
  e.first_dense_layers = 1;
  const int64_t seq = 256;
  const auto cost = [&](int64_t a, int64_t b) {
    double c = b == m.n_layers ? nn::head_flops_per_token(m) : 0.0;
    for (int64_t i = a; i < b; ++i) c += nn::layer_flops_per_token(m, e, i, seq);
    return c;
  };
  for (int64_t pp : {1, 2, 3}) {
    const auto st = balanced_stages(m, e, seq, pp);
    ASSERT_EQ(st.size(), static_cast<size_t>(pp));
    EXPECT_EQ(st.front().first, 0);
    EXPECT_EQ(st.back().second, m.n_layers);
    double worst = 0;
    for (size_t s = 0; s < st.size(); ++s) {
      EXPECT_LT(st[s].first, st[s].second);
      if (s > 0) {
        EXPECT_EQ(st[s].first, st[s - 1].second);
      }
      worst = std::max(worst, cost(st[s].first, st[s].second));
    }
    double best = 1e300;
    if (pp == 1) best = cost(0, m.n_layers);
    for (int64_t a = 1; pp == 2 && a < m.n_layers; ++a)
      best = std::min(best, std::max(cost(0, a), cost(a, m.n_layers)));
    for (int64_t a = 1; pp == 3 && a < m.n_layers; ++a)
      for (int64_t b = a + 1; b < m.n_layers; ++b)
        best = std::min(best, std::max({cost(0, a), cost(a, b), cost(b, m.n_layers)}));
    EXPECT_DOUBLE_EQ(worst, best) << "pp " << pp;
    if (pp == 2) {
      EXPECT_GT(st[0].second - st[0].first, st[1].second - st[1].first)
          << "the head's stage is not lighter";
    }
  }
  EXPECT_THROW(balanced_stages(m, e, seq, 8), Error);
}

// Measured costs: any per-layer costs with an embedding on the first stage
// and a head on the last; the split minimises the largest stage, checked
// against every split of 7 layers into 2 and 3 stages.
TEST(PipelineSchedule, CostBalancedSplitIsOptimalForAnyCosts) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int trial = 0; trial < 50; ++trial) {
    StageCosts c;
    for (int i = 0; i < 7; ++i) c.layers.push_back(u(rng));
    c.embedding = trial % 2 ? u(rng) : 0.0;
    c.head = u(rng) * (trial % 3 + 1);
    const auto cost = [&](int64_t a, int64_t b) {
      double x = (a == 0 ? c.embedding : 0.0) + (b == 7 ? c.head : 0.0);
      for (int64_t i = a; i < b; ++i) x += c.layers[static_cast<size_t>(i)];
      return x;
    };
    double best2 = 1e300, best3 = 1e300;
    for (int64_t a = 1; a < 7; ++a) {
      best2 = std::min(best2, std::max(cost(0, a), cost(a, 7)));
      for (int64_t b = a + 1; b < 7; ++b)
        best3 = std::min(best3, std::max({cost(0, a), cost(a, b), cost(b, 7)}));
    }
    for (int64_t pp : {2, 3}) {
      const auto st = balanced_stages(c, pp);
      ASSERT_EQ(st.size(), static_cast<size_t>(pp));
      double worst = 0;
      for (size_t s = 0; s < st.size(); ++s) {
        EXPECT_EQ(st[s].first, s == 0 ? 0 : st[s - 1].second);
        EXPECT_LT(st[s].first, st[s].second);
        worst = std::max(worst, cost(st[s].first, st[s].second));
      }
      EXPECT_EQ(st.back().second, 7);
      EXPECT_DOUBLE_EQ(worst, pp == 2 ? best2 : best3) << "trial " << trial << " pp " << pp;
    }
  }
}

TEST(PipelineSchedule, RulesNameWhatIsWrong) {
  EXPECT_THROW(pipeline_schedule("1f1b", 4, 0, 3, 1), Error);  // m < pp
  EXPECT_THROW(pipeline_schedule("1f1b", 2, 0, 3, 2), Error);  // interleaved: m % pp
  EXPECT_THROW(pipeline_schedule("zigzag", 2, 0, 4, 1), Error);
  EXPECT_NO_THROW(pipeline_schedule("gpipe", 4, 3, 1, 1));
}

}  // namespace
}  // namespace moetron::parallel
