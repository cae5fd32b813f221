// Expert parallelism under mpirun (2, 4 and 8 ranks): every ep that divides
// the world (ep groups of consecutive dp ranks, expert gradients reduced over
// the dp / ep ranks holding the same experts) computes what one rank
// computes: losses per step, first-step gradients (each rank checks the
// experts it holds), capacity drops, and checkpoints that resume in another
// layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "moetron/ckpt/export.h"
#include "moetron/ckpt/safetensors.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

// tiny.toml has a dense first layer, which Mixtral cannot represent: the
// layouts are compared on the assembled tensors alone.
const ckpt::ExportOptions kTensorsOnly{true};

namespace fs = std::filesystem;

comm::Communicator& world() {
  return test::mpi_world();
}
int64_t dp() {
  return world().size();
}
using test::shared_world;

const std::string& job_dir() {
  return test::layout_job_dir("moetron_ep_");
}
std::string run_dir(const std::string& name, bool local = false) {
  return test::layout_run_dir(job_dir(), name, local);
}
std::string copy_step5(const std::string& from, const std::string& name) {
  return test::copy_step5(job_dir(), from, name);
}
double rel(double a, double b) {
  return test::rel_diff(a, b);
}
using test::block_of;
using test::expect_same_losses;
using test::grads_of;
using test::Reference;
using test::rel_norm_diff;
using test::with;

constexpr int64_t kGlobalRows = 8;  // per micro-batch, over all ranks

// The shared layout-test config (test::layout_config); `rows` per dp rank per micro-batch.
Config ep_config(int64_t rows, const std::vector<std::string>& extra = {}) {
  return test::layout_config(job_dir(), rows, 2, extra);
}

// One rank holding the whole global batch, run by every rank on its own.
const Reference& reference(const std::string& key, const std::vector<std::string>& extra) {
  return test::cached_reference(key, [&] {
    return test::run_reference(ep_config(kGlobalRows, extra), run_dir("ref-" + key, true));
  });
}

std::vector<int64_t> ep_sizes() {
  std::vector<int64_t> out;
  for (int64_t ep : {2, 4}) {
    if (dp() % ep == 0) out.push_back(ep);
  }
  return out;
}

TEST(ExpertParallel, LossesAndGradientsEqualOneRank) {
  for (const std::string opt : {"adamw", "muon"}) {
    const Reference& ref = reference(opt, {"optim.name=" + opt});
    for (int64_t ep : ep_sizes()) {
      const std::string what = opt + " ep " + std::to_string(ep) + " dp " + std::to_string(dp());
      Trainer t(
          ep_config(kGlobalRows / dp(), {"optim.name=" + opt, "parallel.ep=" + std::to_string(ep)}),
          run_dir("ep-" + opt + std::to_string(ep)), false, shared_world());
      // Each rank holds 1/ep of every MoE layer's experts.
      int64_t experts = 0;
      for (const auto& p : t.model().params().all()) experts += p->kind == nn::ParallelKind::expert;
      EXPECT_EQ(experts, 3 * 3 * 4 / ep) << what;
      std::map<std::string, std::vector<float>> grads;
      t.before_update = [&](int64_t step) {
        if (step == 1) grads = grads_of(t);
      };
      const TrainResult r = t.run();
      expect_same_losses(r, ref.result, 0, 1e-5, what);
      EXPECT_LE(rel(r.val_loss, ref.result.val_loss), 1e-5) << what;
      for (const auto& [name, g] : grads) {
        EXPECT_LE(rel_norm_diff(g, ref.first_grads.at(name)), 1e-5) << what << " " << name;
      }
    }
  }
}

// Recomputation re-runs the exchange: moe_dispatch rebuilds the received
// rows in backward, full / sqrt re-run whole blocks (both all-to-alls).
TEST(ExpertParallel, RecomputePoliciesUnderExpertParallelEqualOneRank) {
  const Reference& ref = reference("adamw", {"optim.name=adamw"});
  const int64_t ep = ep_sizes().back();
  for (const std::string policy : {"selective", "full", "sqrt"}) {
    Trainer t(
        ep_config(kGlobalRows / dp(), {"optim.name=adamw", "parallel.ep=" + std::to_string(ep),
                                       "recompute.policy=" + policy}),
        run_dir("ep-recompute-" + policy), false, shared_world());
    expect_same_losses(t.run(), ref.result, 0, 1e-5, policy + " ep " + std::to_string(ep));
  }
}

// With ep = dp the ep group holds the whole micro-batch, so a capacity factor
// drops exactly the (token, expert) slots one rank drops.
TEST(ExpertParallel, CapacityDropsTheSameSlotsAsOneRank) {
  const std::vector<std::string> cap = {"moe.capacity_factor=1.0"};
  const Reference& ref = reference("capacity", cap);
  int64_t dropped = 0;
  for (const auto& h : ref.result.history) dropped += h.dropped;
  ASSERT_GT(dropped, 0) << "the reference drops nothing: the test would not test dropping";
  if (dp() > 4) GTEST_SKIP() << "ep = dp needs dp <= the 4 experts";
  std::vector<std::string> sets = cap;
  sets.push_back("parallel.ep=" + std::to_string(dp()));
  Trainer t(ep_config(kGlobalRows / dp(), sets), run_dir("ep-capacity"), false, shared_world());
  const TrainResult r = t.run();
  expect_same_losses(r, ref.result, 0, 1e-5, "capacity");
  for (size_t i = 0; i < r.history.size(); ++i) {
    EXPECT_EQ(r.history[i].dropped, ref.result.history[i].dropped) << "step " << i + 1;
  }
}

// Saved with experts spread over ep ranks, resumed with every rank holding
// every expert, and the other way round: both continue the one-rank run.
TEST(ExpertParallel, CheckpointsResumeInAnotherLayout) {
  const std::vector<std::string> common = {"optim.name=muon", "checkpoint.every=5"};
  const Reference& ref = reference("ckpt", common);
  const int64_t ep = ep_sizes().back();
  std::vector<std::string> with_ep = common;
  with_ep.push_back("parallel.ep=" + std::to_string(ep));
  const std::string saved = run_dir("ckpt-ep");
  {
    Trainer t(ep_config(kGlobalRows / dp(), with_ep), saved, false, shared_world());
    t.before_update = [](int64_t step) {
      if (step == 6) throw Error("stop after the step-5 checkpoint");
    };
    EXPECT_THROW(t.run(), Error);
  }
  if (world().rank() == 0) {
    // One model file per rank of the first ep group, each with its experts.
    for (int64_t r = 1; r < ep; ++r) {
      EXPECT_TRUE(fs::exists(saved + "/checkpoints/step-5/model-rank-" + std::to_string(r) +
                             ".safetensors"));
    }
    // Past the first ep group a rank writes no expert (it may write a share
    // of the replicated tensors: ckpt/writer_balance.h).
    const std::string past =
        saved + "/checkpoints/step-5/model-rank-" + std::to_string(ep) + ".safetensors";
    if (fs::exists(past)) {
      for (const std::string& name : ckpt::SafetensorsReader(past).names())
        EXPECT_EQ(name.find(".experts."), std::string::npos) << name;
    }
    // `moetron export` of the ep checkpoint: one file with every tensor of
    // the one-rank model, the same shapes, values equal to the shards'.
    const std::string one = job_dir() + "/runs/ref-ckpt-rank0/checkpoints/step-5";
    EXPECT_EQ(ckpt::export_hf(saved + "/checkpoints/step-5", saved + "/export", kTensorsOnly),
              ckpt::export_hf(one, saved + "/export-one", kTensorsOnly));
    ckpt::SafetensorsReader got(saved + "/export/model.safetensors"),
        want(saved + "/export-one/model.safetensors");
    EXPECT_EQ(got.names().size(), want.names().size());
    for (const std::string& name : want.names()) {
      ASSERT_TRUE(got.contains(name)) << name;
      EXPECT_EQ(got.shape(name), want.shape(name)) << name;
    }
    ckpt::SafetensorsReader shard(saved + "/checkpoints/step-5/model-rank-1.safetensors");
    for (const std::string& name : shard.names()) {
      const Tensor a = got.view(name), b = shard.view(name);
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
    }
    EXPECT_THROW(ckpt::export_hf(one, saved + "/export", kTensorsOnly), Error);  // never overwrites
  }
  {
    Trainer t(ep_config(kGlobalRows / dp(), common), copy_step5(saved, "ckpt-ep-to-dp"), true,
              shared_world());
    expect_same_losses(t.run(), ref.result, 5, 1e-5, "ep " + std::to_string(ep) + " -> ep 1");
  }
  {
    // The one-rank reference's step-5 checkpoint, resumed at ep.
    const std::string one = job_dir() + "/runs/ref-ckpt-rank0";
    Trainer t(ep_config(kGlobalRows / dp(), with_ep), copy_step5(one, "ckpt-one-to-ep"), true,
              shared_world());
    expect_same_losses(t.run(), ref.result, 5, 1e-5, "one rank -> ep " + std::to_string(ep));
  }
}

// ZeRO-1 with experts spread over ep ranks: dense state sharded over dp,
// experts updated by their holders (optim/split_optimizer.h); equal to one
// rank, and its checkpoint (dense slices from every rank, each expert's
// state once) resumes in the same layout and on one rank.
TEST(ExpertParallel, ZeroOneWithExpertParallelEqualsOneRank) {
  const int64_t ep = ep_sizes().back();
  for (const std::string opt : {"adamw", "muon"}) {
    const std::vector<std::string> common = {"optim.name=" + opt, "checkpoint.every=5"};
    const Reference& ref = reference("zero-" + opt, common);
    std::vector<std::string> sets = common;
    sets.insert(sets.end(), {"parallel.zero=true", "parallel.ep=" + std::to_string(ep)});
    const std::string what =
        opt + " ZeRO-1 ep " + std::to_string(ep) + " dp " + std::to_string(dp());
    const std::string saved = run_dir("zero-ep-" + opt);
    {
      Trainer t(ep_config(kGlobalRows / dp(), sets), saved, false, shared_world());
      expect_same_losses(t.run(), ref.result, 0, 1e-5, what);
    }
    {
      Trainer t(ep_config(kGlobalRows / dp(), sets), copy_step5(saved, "zero-ep-resume-" + opt),
                true, shared_world());
      expect_same_losses(t.run(), ref.result, 5, 1e-5, what + " resumed");
    }
    {
      Trainer t(ep_config(kGlobalRows / dp(), common), copy_step5(saved, "zero-ep-to-dp-" + opt),
                true, shared_world());
      expect_same_losses(t.run(), ref.result, 5, 1e-5, what + " -> plain dp");
    }
  }
}

TEST(ExpertParallel, LayoutErrorsNameTheKey) {
  // 2 ranks: ep 4 does not divide the world; 4 or 8 ranks: ep 8 does not divide the 4 experts.
  const int64_t bad = dp() == 2 ? 4 : 8;
  try {
    Trainer t(ep_config(kGlobalRows / dp(), {"parallel.ep=" + std::to_string(bad)}),
              run_dir("ep-bad"), false, shared_world());
    ADD_FAILURE() << "parallel.ep = " << bad << " accepted on " << dp() << " ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.ep"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moetron::train
