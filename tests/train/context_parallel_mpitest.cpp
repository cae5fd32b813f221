// Context parallelism under mpirun (2, 4 and 8 ranks): every sequence split
// over cp ranks (rank r holding chunks r and 2cp - 1 - r), alone and composed
// with dp, tp (+ sequence parallelism), pp and ep, computes what one rank
// computes: losses per step, the validation loss and the first step's
// gradients; under hybrid attention (sliding window + global tokens) with
// packed documents, under recomputation; and a checkpoint saved at cp 2
// resumes at cp 1 (and the one-rank checkpoint under cp).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

comm::Communicator& world() {
  return test::mpi_world();
}
using test::shared_world;

const std::string& job_dir() {
  return test::layout_job_dir("moetron_cp_");
}
std::string run_dir(const std::string& name, bool local = false) {
  return test::layout_run_dir(job_dir(), name, local);
}
using test::expect_same_losses;
using test::Reference;
using test::with;

constexpr int64_t kGlobalRows = 8;  // per micro-batch, over all ranks

Config cp_config(int64_t rows, const std::vector<std::string>& extra = {}) {
  return test::layout_config(job_dir(), rows, 2, extra);
}

const Reference& reference(const std::string& key, const std::vector<std::string>& extra) {
  return test::cached_reference(key, [&] {
    return test::run_reference(cp_config(kGlobalRows, extra), run_dir("ref-" + key, true));
  });
}

struct Layout {
  std::string name;
  std::vector<std::string> sets;
  int64_t dp;
};

Layout layout(int64_t cp, int64_t tp = 1, int64_t pp = 1, int64_t ep = 1) {
  const int64_t dp = world().size() / (cp * tp * pp);
  Layout l{"cp" + std::to_string(cp), {"parallel.cp=" + std::to_string(cp)}, dp};
  if (tp > 1) {
    l.name += "-tp" + std::to_string(tp) + "-sp";
    l.sets.push_back("parallel.tp=" + std::to_string(tp));
    l.sets.push_back("parallel.sequence_parallel=true");
  }
  if (pp > 1) {
    l.name += "-pp" + std::to_string(pp);
    l.sets.push_back("parallel.pp=" + std::to_string(pp));
  }
  if (ep > 1) {
    l.name += "-ep" + std::to_string(ep);
    l.sets.push_back("parallel.ep=" + std::to_string(ep));
  }
  l.name += "-dp" + std::to_string(dp);
  return l;
}

std::vector<Layout> layouts() {
  switch (world().size()) {
    case 2:
      return {layout(2)};
    case 4:
      return {layout(2), layout(4), layout(2, 2), layout(2, 1, 2), layout(2, 1, 1, 2)};
    default:
      return {layout(2, 2), layout(2, 1, 2), layout(2, 1, 1, 2), layout(4), layout(2, 2, 2)};
  }
}

void expect_run_equals_reference(const Reference& ref, const Layout& l,
                                 const std::vector<std::string>& sets, const std::string& dir) {
  const std::string what = l.name + " " + dir;
  Trainer t(cp_config(kGlobalRows / l.dp, with(sets, l.sets)), run_dir(dir + "-" + l.name), false,
            shared_world());
  test::expect_run_matches(t, ref, what, /*aux=*/true);
}

TEST(ContextParallel, LossesAndGradientsEqualOneRank) {
  for (const std::string opt : {"adamw", "muon"}) {
    const Reference& ref = reference(opt, {"optim.name=" + opt});
    for (const Layout& l : layouts())
      expect_run_equals_reference(ref, l, {"optim.name=" + opt}, opt);
  }
}

// The ring under a sliding window (5) with a global token per document, on
// packed documents: each (query chunk, key chunk) call works in shifted
// coordinates, and documents start inside and across chunks.
TEST(ContextParallel, HybridAttentionOnPackedDocumentsEqualsOneRank) {
  const std::vector<std::string> docs = {"attention.window=5", "attention.global_tokens=1",
                                         "attention.layer_pattern=LG", "data.document_mask=true"};
  const Reference& ref = reference("docs", docs);
  for (const Layout& l : layouts()) expect_run_equals_reference(ref, l, docs, "docs");
  const std::vector<std::string> hybrid = {"attention.window=3", "attention.global_tokens=2",
                                           "attention.layer_pattern=L"};
  const Reference& local_ref = reference("local", hybrid);
  expect_run_equals_reference(local_ref, layouts().front(), hybrid, "local");
  // A window inside one chunk without global tokens: at cp 4 only ring
  // distances 1 and 3 are exchanged (nn::context_ring_offsets).
  if (world().size() >= 4) {
    const std::vector<std::string> window = {"attention.window=2", "attention.layer_pattern=L"};
    expect_run_equals_reference(reference("window", window), layout(4), window, "window");
  }
}

// Recompute: attn_core rebuilds the attention from the saved whole-sequence
// K/V (no ring); full re-runs each block's forward, ring included.
TEST(ContextParallel, RecomputePoliciesEqualOneRank) {
  const Reference& ref = reference("adamw", {"optim.name=adamw"});
  for (const std::string policy : {"selective", "full"}) {
    expect_run_equals_reference(ref, layouts().front(),
                                {"optim.name=adamw", "recompute.policy=" + policy},
                                "recompute-" + policy);
  }
}

// parallel.cp_comm = "all_to_all" (Ulysses): each rank attends the whole
// sequence with half of tiny's 4 query and 2 kv heads; the same runs as the
// ring's, with packed documents under hybrid attention, recompute and ep.
TEST(ContextParallel, AllToAllEqualsOneRank) {
  std::vector<Layout> picked = {layout(2)};
  if (world().size() >= 4) {
    picked.push_back(layout(2, 1, 2));
    picked.push_back(layout(2, 1, 1, 2));
  }
  const std::vector<std::string> a2a = {"parallel.cp_comm=all_to_all"};
  const Reference& ref = reference("adamw", {"optim.name=adamw"});
  for (const Layout& l : picked)
    expect_run_equals_reference(ref, l, with(a2a, {"optim.name=adamw"}), "a2a");
  const std::vector<std::string> docs = {"attention.window=5", "attention.global_tokens=1",
                                         "attention.layer_pattern=LG", "data.document_mask=true"};
  expect_run_equals_reference(reference("docs", docs), picked.front(), with(a2a, docs), "a2a-docs");
  expect_run_equals_reference(ref, picked.front(),
                              with(a2a, {"optim.name=adamw", "recompute.policy=selective"}),
                              "a2a-selective");
}

// The cp ranks hold the same weights: a checkpoint saved at cp 2 is the
// one-rank checkpoint and resumes without cp, and the one-rank checkpoint
// resumes under cp.
TEST(ContextParallel, CheckpointsResumeAcrossCp) {
  const std::vector<std::string> common = {"optim.name=muon", "checkpoint.every=5"};
  const Reference& ref = reference("ckpt", common);
  const Layout l = layouts().front();
  const std::string saved = run_dir("ckpt-cp");
  {
    Trainer t(cp_config(kGlobalRows / l.dp, with(common, l.sets)), saved, false, shared_world());
    t.before_update = [](int64_t step) {
      if (step == 6) throw Error("stop after the step-5 checkpoint");
    };
    EXPECT_THROW(t.run(), Error);
  }
  {
    const int64_t dp = world().size();
    Trainer t(cp_config(kGlobalRows / dp, common),
              test::copy_step5(job_dir(), saved, "ckpt-cp-to-dp"), true, shared_world());
    expect_same_losses(t.run(), ref.result, 5, 1e-5, l.name + " -> cp1 dp" + std::to_string(dp));
  }
  {
    const Layout other = layouts().back();
    Trainer t(cp_config(kGlobalRows / other.dp, with(common, other.sets)),
              test::copy_step5(job_dir(), job_dir() + "/runs/ref-ckpt-rank0", "ckpt-one-to-cp"),
              true, shared_world());
    expect_same_losses(t.run(), ref.result, 5, 1e-5, "one rank -> " + other.name);
  }
}

// Bad layouts are refused by key.
TEST(ContextParallel, BadSettingsAreRefusedByKey) {
  const auto refused = [](const std::vector<std::string>& sets, const std::string& key) {
    try {
      (void)cp_config(1, sets);
      ADD_FAILURE() << "accepted " << sets.front();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused({"parallel.cp=3"}, "parallel.cp");  // 6 does not divide seq_len 16
  refused({"parallel.cp=2", "train.seq_chunk=8"}, "parallel.cp");
  refused({"parallel.cp=2", "parallel.cp_comm=ulysses"}, "parallel.cp_comm");
  // tiny's 2 kv heads do not split over 4 ranks.
  refused({"parallel.cp=4", "parallel.cp_comm=all_to_all"}, "parallel.cp_comm");
}

}  // namespace
}  // namespace moetron::train
