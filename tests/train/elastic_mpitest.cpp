// Elastic resize under mpirun (2 and 4 ranks): a job of n data-parallel
// ranks (ZeRO-1) is asked to stop for a resize (the launcher's stop-request
// file), goes on with n - 1 ranks from the snapshot, then grows back to n.
// The global batch is kept by accumulation; every training sample is used
// exactly once; the final weights match the uninterrupted n-rank run's.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "moetron/core/staged_dir.h"
#include "moetron/train/launcher.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

comm::Communicator& world() {
  return test::mpi_world();
}
const std::string& job_dir() {
  return test::layout_job_dir("moetron_elastic_");
}

constexpr int64_t kGlobalBatch = 12;  // rows per step: splits over 1, 2, 3 and 4 ranks
constexpr int64_t kSteps = 9;

Config config(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {
      "train.steps=" + std::to_string(kSteps), "train.global_batch=" + std::to_string(kGlobalBatch),
      "parallel.zero=true", "checkpoint.snapshot_every=1",
      // The Switch aux loss takes its statistics over the dp ranks' rows of a
      // micro-batch, so a resize changes which rows share them (another
      // training); aux-loss-free balancing does not couple rows.
      "moe.aux_loss_coef=0", "checkpoint.snapshot_dir=" + job_dir() + "/shm"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::layout_config(job_dir(), 1, 1, sets);  // grad_accum derived from global_batch
}

struct Phase {
  TrainResult result;
  std::map<std::string, std::vector<float>> params;  // rank 0's, at the end
};

// Trains on the first `ranks` ranks (the others wait) from what `dir` holds;
// with stop_after > 0 the launcher's stop request arrives before that step.
Phase run_phase(const std::string& dir, int ranks, bool resume, int64_t stop_after,
                const std::vector<std::string>& extra,
                std::vector<std::pair<int64_t, uint64_t>>* samples) {
  const std::string logs = dir + "/logs";
  if (world().rank() == 0) {
    fs::create_directories(logs);
    fs::remove(logs + "/stop-request");
  }
  world().barrier();
  std::shared_ptr<comm::Communicator> group =
      world().split(world().rank() < ranks ? 0 : 1, world().rank());
  Phase out;
  if (world().rank() < ranks) {
    Trainer t(config(extra), dir, resume, group);
    t.on_sample = [&](int64_t step, uint64_t s) { samples->emplace_back(step, s); };
    t.before_update = [&](int64_t step) {
      if (stop_after > 0 && step == stop_after - 1 && world().rank() == 0)
        std::ofstream(logs + "/stop-request") << "resize\n";
    };
    out.result = t.run();
    for (const auto& p : t.model().params().all()) {
      const Tensor v = p->value;
      out.params[p->name].assign(v.data<float>(), v.data<float>() + v.numel());
    }
  }
  world().barrier();
  return out;
}

double max_difference(const Phase& a, const Phase& b) {
  double worst = 0;
  for (const auto& [name, want] : a.params) {
    const std::vector<float>& got = b.params.at(name);
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  }
  return worst;
}

// Every sample of the kSteps steps used exactly once, over all ranks and phases.
void expect_every_sample_once(const std::vector<std::pair<int64_t, uint64_t>> (&samples)[3]) {
  std::vector<int64_t> counts(static_cast<size_t>(kSteps * kGlobalBatch), 0);
  for (const auto& phase : samples) {
    for (const auto& [step, s] : phase) {
      ASSERT_LT(s, counts.size());
      ++counts[s];
    }
  }
  Tensor all = Tensor::wrap(counts.data(), {static_cast<int64_t>(counts.size())}, DType::i64);
  world().allreduce(all, comm::ReduceOp::sum);
  for (size_t s = 0; s < counts.size(); ++s) EXPECT_EQ(counts[s], 1) << "sample " << s;
}

struct ElasticRun {
  Phase reference, end;  // the uninterrupted n-rank run's and the resized run's last phase
};

// n ranks for 3 steps, n - 1 for 3, n again for 3; and the uninterrupted run.
ElasticRun shrink_and_grow(const std::string& name, const std::vector<std::string>& extra) {
  const std::string& job = job_dir();
  const int n = world().size();
  ::setenv(kLaunchLogDirEnv, (job + "/runs/" + name + "/logs").c_str(), 1);
  const std::string ref_dir = test::layout_run_dir(job, name + "-reference");
  const std::string dir = test::layout_run_dir(job, name);
  std::vector<std::pair<int64_t, uint64_t>> ignored, samples[3];
  ElasticRun out;
  out.reference = run_phase(ref_dir, n, false, 0, extra, &ignored);
  const Phase a = run_phase(dir, n, false, 3, extra, &samples[0]);
  const Phase b = run_phase(dir, n - 1, true, 6, extra, &samples[1]);
  out.end = run_phase(dir, n, true, 0, extra, &samples[2]);
  ::unsetenv(kLaunchLogDirEnv);
  if (world().rank() == 0) {
    EXPECT_TRUE(a.result.stopped_for_resize);
    EXPECT_EQ(a.result.steps_done, 3);
    EXPECT_TRUE(b.result.stopped_for_resize);
    EXPECT_EQ(b.result.steps_done, 3);
    EXPECT_FALSE(out.end.result.stopped_for_resize);
    EXPECT_EQ(out.end.result.steps_done, 3);
  }
  expect_every_sample_once(samples);
  return out;
}

TEST(Elastic, ShrinkAndGrowBackKeepsTheRunAndEverySample) {
  const ElasticRun run = shrink_and_grow("elastic", {});
  if (world().rank() != 0) return;
  const double worst = max_difference(run.reference, run.end);
  std::cerr << "elastic " << world().size() << " -> " << world().size() - 1 << " -> "
            << world().size() << ": max |weight - uninterrupted| = " << worst << "\n";
  EXPECT_LE(worst, 1e-5);
}

double l2_difference(const Phase& a, const Phase& b) {
  double sum = 0;
  for (const auto& [name, want] : a.params) {
    const std::vector<float>& got = b.params.at(name);
    for (size_t i = 0; i < want.size(); ++i) sum += std::pow(double{got[i]} - double{want[i]}, 2);
  }
  return std::sqrt(sum);
}

// With int8 compression the n - 1 rank phase quantises other per-rank sums
// (each rank's block scales come from its own rows), so the resized run
// cannot match the uninterrupted one to 1e-5 as the uncompressed run does:
// it differs as any change of dp would. What the resize must not add is a
// lost or doubled error feedback: the residuals are folded onto the new
// ranks (each rank's pending error lands on exactly one rank; the exact sums
// are tested in tests/ckpt/folded_state_test.cpp). Measured (L2 of the
// weight difference, the uninterrupted int8 run against the uninterrupted
// uncompressed one being 0.22 / 0.23 at np 2 / 4): folded 0.038 / 0.037,
// residuals dropped at each resize 0.050 / 0.062. The bound, 1/5 of what
// compression itself changes, fails when the residuals are dropped.
TEST(Elastic, WithCompressionTheResidualsFollowTheResize) {
  const std::vector<std::string> int8 = {"parallel.compression=int8",
                                         "parallel.compression_block=64"};
  const ElasticRun run = shrink_and_grow("elastic-int8", int8);
  std::vector<std::pair<int64_t, uint64_t>> ignored;
  const Phase plain = run_phase(test::layout_run_dir(job_dir(), "uncompressed-reference"),
                                world().size(), false, 0, {}, &ignored);
  if (world().rank() != 0) return;
  const double resize = l2_difference(run.reference, run.end);
  const double compression = l2_difference(run.reference, plain);
  std::cerr << "elastic int8 " << world().size() << " -> " << world().size() - 1 << " -> "
            << world().size() << ": |weights - uninterrupted int8| = " << resize
            << " (L2; uninterrupted int8 - uncompressed: " << compression
            << "), max abs = " << max_difference(run.reference, run.end) << "\n";
  EXPECT_LE(resize, 0.2 * compression);
}

}  // namespace
}  // namespace moetron::train
