// Pipeline parallelism under mpirun (2, 4 and 8 ranks): GPipe, 1F1B and
// interleaved 1F1B, alone and composed with dp, tp (with sequence
// parallelism) and ep, compute what one rank computes (losses per step,
// validation loss, first-step gradients of every tensor this rank's stage
// holds), and checkpoints saved under pp resume in another layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

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
using test::shared_world;

const std::string& job_dir() {
  return test::layout_job_dir("moetron_pp_");
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
using test::grads_of;
using test::Reference;
using test::rel_norm_diff;
using test::with;
// Losses and the balancing loss (summed over the stages) equal one rank's.
void expect_same_losses(const TrainResult& got, const TrainResult& want, size_t from, double tol,
                        const std::string& what) {
  test::expect_same_losses(got, want, from, tol, what, true);
}

constexpr int64_t kRows = 4;          // per micro-batch, over the dp ranks of a stage
constexpr int64_t kMicrobatches = 4;  // per step: >= pp for 1F1B at pp 4

// The shared layout-test config (test::layout_config); `rows` per dp rank per micro-batch.
Config pp_config(int64_t rows, const std::vector<std::string>& extra = {}) {
  return test::layout_config(job_dir(), rows, kMicrobatches, extra);
}

// One rank holding the whole global batch, run by every rank on its own.
const Reference& reference(const std::string& key, const std::vector<std::string>& extra) {
  return test::cached_reference(key, [&] {
    return test::run_reference(pp_config(kRows, extra), run_dir("ref-" + key, true));
  });
}

struct Layout {
  std::string name;
  std::vector<std::string> sets;
  int64_t dp;
};

std::vector<Layout> layouts() {
  const int64_t n = world().size();
  std::vector<Layout> out;
  const auto add = [&](int64_t pp, int64_t v, const std::string& schedule, int64_t tp, int64_t ep,
                       bool sp) {
    std::string name = "pp" + std::to_string(pp) + (v > 1 ? "-vpp" + std::to_string(v) : "") + "-" +
                       schedule + "-dp" + std::to_string(n / pp / tp);
    std::vector<std::string> sets = {
        "parallel.pp=" + std::to_string(pp), "parallel.vpp=" + std::to_string(v),
        "parallel.schedule=" + schedule, "parallel.tp=" + std::to_string(tp),
        "parallel.ep=" + std::to_string(ep)};
    if (tp > 1) name += "-tp" + std::to_string(tp);
    if (ep > 1) name += "-ep" + std::to_string(ep);
    if (sp) {
      name += "-sp";
      sets.push_back("parallel.sequence_parallel=true");
    }
    out.push_back({name, sets, n / pp / tp});
  };
  if (n == 2) {
    add(2, 1, "1f1b", 1, 1, false);
    add(2, 1, "gpipe", 1, 1, false);
    add(2, 2, "1f1b", 1, 1, false);  // interleaved
  } else if (n == 4) {
    add(4, 1, "1f1b", 1, 1, false);
    add(2, 1, "1f1b", 1, 2, false);  // pp2 dp2 ep2
    add(2, 2, "1f1b", 2, 1, true);   // interleaved pp2 tp2 sp
    add(2, 1, "gpipe", 1, 1, false);
  } else {
    add(2, 1, "1f1b", 2, 1, false);  // dp2 tp2 pp2
    add(2, 1, "1f1b", 2, 2, true);   // pp2 ep2 tp2 (dp2), sequence parallel
    add(2, 2, "1f1b", 1, 4, false);  // interleaved pp2 ep4 (dp4)
    add(4, 1, "1f1b", 2, 1, false);
  }
  return out;
}

// Runs t, expecting the losses of the one-rank run and, for every tensor
// this rank's stage holds (and only those), its block of the one-rank
// first-step gradient.
TrainResult run_matching_one_rank(Trainer& t, const Reference& ref, const std::string& what) {
  std::map<std::string, std::vector<float>> grads;
  t.before_update = [&](int64_t step) {
    if (step == 1) grads = grads_of(t);
  };
  const TrainResult r = t.run();
  expect_same_losses(r, ref.result, 0, 1e-5, what);
  EXPECT_LT(grads.size(), ref.first_grads.size()) << what;
  for (const auto& p : t.model().params().all()) {
    const std::vector<float>& g = grads.at(p->name);
    const std::vector<float> want = block_of(*p, ref.first_grads.at(p->name));
    EXPECT_EQ(g.size(), want.size()) << what << " " << p->name;
    if (g.size() == want.size()) {
      EXPECT_LE(rel_norm_diff(g, want), 1e-5) << what << " " << p->name;
    }
  }
  return r;
}

TEST(PipelineParallel, LossesAndGradientsEqualOneRank) {
  for (const std::string opt : {"adamw", "muon"}) {
    const Reference& ref = reference(opt, {"optim.name=" + opt});
    for (const Layout& l : layouts()) {
      const std::string what = opt + " " + l.name;
      Trainer t(pp_config(kRows / l.dp, with({"optim.name=" + opt}, l.sets)),
                run_dir("pp-" + opt + l.name), false, shared_world());
      const TrainResult r = run_matching_one_rank(t, ref, what);
      EXPECT_LE(rel(r.val_loss, ref.result.val_loss), 1e-5) << what;
      // Every step waited on the other stages at least a little (the bubble).
      for (const auto& h : r.history) EXPECT_GT(h.pipeline_wait_s, 0.0) << what;
    }
  }
}

// Packed documents (positions and masks from the token ids every stage
// receives) under hybrid attention, on pipeline layouts (with tp and
// sequence parallelism at 4 ranks), equal one rank; and the document mask
// does change the run.
TEST(PipelineParallel, PackedDocumentsUnderHybridAttentionEqualOneRank) {
  const std::vector<std::string> hybrid = {"attention.window=5", "attention.global_tokens=1",
                                           "attention.layer_pattern=LG"};
  const std::vector<std::string> docs = with(hybrid, {"data.document_mask=true"});
  const Reference& ref = reference("docs", docs);
  const Reference& plain = reference("hybrid", hybrid);
  EXPECT_GT(rel(ref.result.history.back().loss, plain.result.history.back().loss), 1e-3);
  std::vector<Layout> picked = {layouts().front()};
  if (world().size() == 4) picked.push_back(layouts()[2]);
  for (const Layout& l : picked) {
    Trainer t(pp_config(kRows / l.dp, with(docs, l.sets)), run_dir("docs-" + l.name), false,
              shared_world());
    run_matching_one_rank(t, ref, "documents " + l.name);
  }
}

// Saved with the layers on pp stages (each stage's first rank writing its
// tensors and router biases), resumed without pp, and the one-rank
// checkpoint resumed under pp: both continue the one-rank run.
TEST(PipelineParallel, CheckpointsResumeInAnotherLayout) {
  const std::vector<std::string> common = {"optim.name=muon", "checkpoint.every=5"};
  const Reference& ref = reference("ckpt", common);
  const Layout l = layouts().front();
  const std::string saved = run_dir("ckpt-pp");
  {
    Trainer t(pp_config(kRows / l.dp, with(common, l.sets)), saved, false, shared_world());
    t.before_update = [](int64_t step) {
      if (step == 6) throw Error("stop after the step-5 checkpoint");
    };
    EXPECT_THROW(t.run(), Error);
  }
  if (world().rank() == 0) {
    const std::string one = job_dir() + "/runs/ref-ckpt-rank0/checkpoints/step-5";
    EXPECT_EQ(ckpt::export_hf(saved + "/checkpoints/step-5", saved + "/export", kTensorsOnly),
              ckpt::export_hf(one, saved + "/export-one", kTensorsOnly));
    ckpt::SafetensorsReader got(saved + "/export/model.safetensors"),
        want(saved + "/export-one/model.safetensors");
    EXPECT_EQ(got.names(), want.names());
  }
  {
    // Without pp: experts over ep ranks, dp over every rank (with tp 2 where
    // the ranks outnumber the rows): e.g. saved at dp2 tp2 pp2, resumed at ep4 dp4 tp2.
    const int64_t dp = std::min(world().size(), static_cast<int>(kRows)),
                  ep = std::min(world().size(), 4);
    Trainer t(
        pp_config(kRows / dp, with(common, {"parallel.tp=" + std::to_string(world().size() / dp),
                                            "parallel.ep=" + std::to_string(ep)})),
        copy_step5(saved, "ckpt-pp-to-dp"), true, shared_world());
    expect_same_losses(t.run(), ref.result, 5, 1e-5,
                       l.name + " -> ep " + std::to_string(ep) + " dp " + std::to_string(dp));
  }
  {
    const Layout other = layouts().back();
    const std::string one = job_dir() + "/runs/ref-ckpt-rank0";
    Trainer t(pp_config(kRows / other.dp, with(common, other.sets)),
              copy_step5(one, "ckpt-one-to-pp"), true, shared_world());
    expect_same_losses(t.run(), ref.result, 5, 1e-5, "one rank -> " + other.name);
  }
}

// recompute full / sqrt under pp: each chunk checkpointed on its own, every
// micro-batch in flight keeping its segments' inputs and routing records,
// equals one rank under the same policy (losses and first-step gradients).
TEST(PipelineParallel, SegmentRecomputeEqualsOneRank) {
  const int64_t n = world().size();
  struct Run {
    std::string policy;
    std::vector<std::string> sets;
    int64_t dp;
  };
  std::vector<Run> runs;
  if (n == 2) {
    runs = {{"full", {"parallel.pp=2"}, 1},
            {"sqrt", {"parallel.pp=2", "parallel.schedule=gpipe"}, 1},
            {"full", {"parallel.pp=2", "parallel.vpp=2"}, 1}};
  } else if (n == 4) {
    runs = {{"full", {"parallel.pp=2", "parallel.ep=2"}, 2}, {"sqrt", {"parallel.pp=4"}, 1}};
  } else {
    runs = {{"full",
             {"parallel.pp=2", "parallel.tp=2", "parallel.ep=2", "parallel.sequence_parallel=true"},
             2}};
  }
  for (const Run& run : runs) {
    const std::vector<std::string> policy = {"recompute.policy=" + run.policy};
    const Reference& ref = reference("segments-" + run.policy, policy);
    const std::string what = run.policy + " " + run.sets.back();
    Trainer t(pp_config(kRows / run.dp, with(policy, run.sets)), run_dir("pp-seg-" + run.policy),
              false, shared_world());
    run_matching_one_rank(t, ref, what);
  }
}

// Stages balanced by costs measured on this machine: every rank takes the
// ranks' mean timings, so all split alike (a disagreement would hang or
// fail the sends), and the run still equals one rank.
TEST(PipelineParallel, MeasuredStageBalanceEqualsOneRank) {
  const int64_t pp = std::min(world().size(), 4);
  const std::vector<std::string> sets = {"parallel.pp=" + std::to_string(pp),
                                         "parallel.stage_balance=measured", "optim.name=adamw"};
  const Reference& ref = reference("adamw", {"optim.name=adamw"});
  const int64_t dp = world().size() / pp;
  Trainer t(pp_config(kRows / dp, sets), run_dir("pp-measured"), false, shared_world());
  run_matching_one_rank(t, ref, "measured stage balance pp " + std::to_string(pp));
}

TEST(PipelineParallel, LayoutErrorsNameTheRule) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"parallel.pp=2", "parallel.vpp=4"}, "parallel.vpp"},  // 8 virtual stages over 4 layers
      {{"parallel.pp=8"}, "parallel.pp"},                     // more stages than layers
      {{"parallel.cp=3"}, "parallel.cp"},                     // 6 chunks do not split seq_len 16
      {{"parallel.pp=2", "train.grad_accum=1"}, "1F1B needs at least as many micro-batches"},
      {{"parallel.pp=2", "parallel.schedule=zigzag"}, "parallel.schedule"},
      {{"parallel.pp=2", "parallel.stage_balance=guess"}, "parallel.stage_balance"},
  };
  for (const auto& [sets, want] : bad) {
    try {
      Trainer t(pp_config(kRows / (world().size() / 2), sets), run_dir("pp-bad"), false,
                shared_world());
      t.run();
      ADD_FAILURE() << sets.back() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace moetron::train
