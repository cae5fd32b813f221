// Bucket plans: every parameter placed once; flat buckets split evenly;
// the owner plan keeps each selected matrix inside one rank's chunk and
// balances the Newton-Schulz cost.
#include "moetron/parallel/bucket_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace moetron::parallel {
namespace {

nn::ParameterSet make_params() {
  nn::ParameterSet ps;
  ps.add("embed", {50, 8}, DType::f32, DType::f32, nn::ParallelKind::vocab, nn::InitKind::normal,
         0.02f, false);
  for (int l = 0; l < 3; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    ps.add(p + "norm", {8}, DType::f32, DType::f32, nn::ParallelKind::replicated,
           nn::InitKind::ones, 0, false);
    ps.add(p + "q", {16, 8}, DType::f32, DType::f32, nn::ParallelKind::column, nn::InitKind::normal,
           0.02f, true);
    ps.add(p + "k", {8, 8}, DType::f32, DType::f32, nn::ParallelKind::column, nn::InitKind::normal,
           0.02f, true);
    for (int e = 0; e < 5; ++e) {
      ps.add(p + "expert" + std::to_string(e), {12, 8}, DType::f32, DType::f32,
             nn::ParallelKind::expert, nn::InitKind::normal, 0.02f, true);
    }
  }
  return ps;
}

void expect_covers_once(const nn::ParameterSet& ps, const std::vector<BucketSpec>& plan, int dp) {
  std::map<const nn::Parameter*, int> seen;
  for (const auto& b : plan) {
    EXPECT_EQ(b.numel % dp, 0);
    for (const auto& s : b.slots) {
      ++seen[s.param];
      EXPECT_EQ(s.numel, s.param->grad.numel());
      EXPECT_LE(s.offset + s.numel, b.numel);
    }
    // No two slots overlap.
    for (size_t i = 0; i < b.slots.size(); ++i)
      for (size_t j = i + 1; j < b.slots.size(); ++j) {
        const auto &a = b.slots[i], &c = b.slots[j];
        EXPECT_TRUE(a.offset + a.numel <= c.offset || c.offset + c.numel <= a.offset)
            << a.param->name << " " << c.param->name;
      }
  }
  EXPECT_EQ(seen.size(), ps.all().size());
  for (const auto& [p, n] : seen) EXPECT_EQ(n, 1) << p->name;
}

TEST(BucketPlan, FlatPlanCoversEveryParameterOnceInReverseOrder) {
  const nn::ParameterSet ps = make_params();
  for (int dp : {1, 3, 4}) {
    const auto plan = flat_bucket_plan(ps, dp, 1000);
    expect_covers_once(ps, plan, dp);
    EXPECT_EQ(plan.front().slots.front().param, ps.all().back().get());
    EXPECT_EQ(plan.back().slots.back().param, ps.all().front().get());
  }
}

TEST(BucketPlan, OwnerPlanKeepsEachMatrixInsideItsOwnersChunkAndBalancesCost) {
  const nn::ParameterSet ps = make_params();
  auto owned = [](const nn::Parameter& p) { return p.hidden_matrix; };
  for (int dp : {2, 3, 4}) {
    const auto plan = owner_bucket_plan(ps, dp, 4 * 400, owned);
    expect_covers_once(ps, plan, dp);
    std::vector<double> cost(static_cast<size_t>(dp), 0.0);
    for (const auto& b : plan) {
      const int64_t chunk = b.numel / dp;
      for (const auto& s : b.slots) {
        EXPECT_EQ(s.owner >= 0, s.param->hidden_matrix) << s.param->name;
        if (s.owner < 0) continue;
        EXPECT_EQ(s.offset / chunk, s.owner) << s.param->name;
        EXPECT_EQ((s.offset + s.numel - 1) / chunk, s.owner) << s.param->name;
        cost[static_cast<size_t>(s.owner)] +=
            newton_schulz_cost(s.param->value.dim(0), s.param->value.dim(1));
      }
    }
    // Largest-first to the least loaded: no rank exceeds the mean by more than one matrix's cost.
    double total = 0, biggest = newton_schulz_cost(16, 8);
    for (double c : cost) total += c;
    for (double c : cost) EXPECT_LE(c, total / dp + biggest) << "dp " << dp;
  }
}

// The fullest chunk's share of some ranges, against a count per element.
TEST(BucketPlan, MaxChunkShareIsTheFullestChunksCount) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + trial % 5, chunk = 1 + static_cast<int64_t>(rng() % 40);
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::vector<int> held(static_cast<size_t>(n * chunk), 0);
    for (int64_t at = 0; at < n * chunk;) {  // disjoint ranges with gaps, as a bucket's slots are
      const int64_t len = std::min<int64_t>(1 + static_cast<int64_t>(rng() % 30), n * chunk - at);
      if (rng() % 2) {
        ranges.emplace_back(at, len);
        for (int64_t i = at; i < at + len; ++i) held[static_cast<size_t>(i)] = 1;
      }
      at += len;
    }
    int64_t want = 0;
    for (int64_t r = 0; r < n; ++r) {
      int64_t c = 0;
      for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) c += held[static_cast<size_t>(i)];
      want = std::max(want, c);
    }
    EXPECT_EQ(max_chunk_share(ranges, chunk, n), want) << "trial " << trial;
  }
  EXPECT_EQ(max_chunk_share({}, 8, 4), 0);
}

}  // namespace
}  // namespace moetron::parallel
