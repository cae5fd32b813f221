// ZeRO-1 and fp16 in the composed layouts under mpirun (2, 4 and 8 ranks):
// the optimizer state sharded over dp inside tp and pp (the dense state over
// dp, the tp-partial router and shared experts over dp x tp, experts whole
// under ep), with AdamW and Muon (owner-based and gathered; tp-sharded
// matrices orthogonalised whole), computes what one rank computes; its
// checkpoints (ranges of tp blocks) resume in another layout; and the fp16
// model trains under tp (f16 activations reduced in fp32) as one rank does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moetron/ckpt/export.h"
#include "moetron/ckpt/safetensors.h"
#include "moetron/core/allocator.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

// tiny.toml has a dense first layer, which Mixtral cannot represent: the
// layouts are compared on the assembled tensors alone.
const ckpt::ExportOptions kTensorsOnly{true};

comm::Communicator& world() {
  return test::mpi_world();
}
using test::shared_world;

const std::string& job_dir() {
  return test::layout_job_dir("moetron_zero_");
}
std::string run_dir(const std::string& name, bool local = false) {
  return test::layout_run_dir(job_dir(), name, local);
}
std::string copy_step5(const std::string& from, const std::string& name) {
  return test::copy_step5(job_dir(), from, name);
}
using test::Reference;
using test::with;

constexpr int64_t kRows = 4;          // per micro-batch, over the dp ranks of a stage
constexpr int64_t kMicrobatches = 4;  // per step: >= pp for 1F1B
// fp16 under tp against one rank: the first steps agree to f16 rounding of
// the reductions (measured 2e-6), later ones drift as training amplifies it
// (measured up to 7e-4 by step 10 at tp2, the same with sp, ZeRO-1 and pp2).
constexpr double kFp16FirstSteps = 1e-5, kFp16Tolerance = 2e-3;

// The shared layout-test config (test::layout_config); `rows` per dp rank per micro-batch.
Config zero_config(int64_t rows, const std::vector<std::string>& extra = {}) {
  return test::layout_config(job_dir(), rows, kMicrobatches, extra);
}

// One rank holding the whole global batch, run by every rank on its own.
const Reference& reference(const std::string& key, const std::vector<std::string>& extra) {
  return test::cached_reference(key, [&] {
    return test::run_reference(zero_config(kRows, extra), run_dir("ref-" + key, true));
  });
}

struct Layout {
  std::string name;
  std::vector<std::string> sets;  // with the optimizer
  int64_t dp;
  std::string optimizer;
};

// ZeRO-1 layouts of this world size; each runs the optimizer that exercises
// its path (Muon where tp-sharded matrices are gathered over tp).
std::vector<Layout> zero_layouts() {
  const int64_t n = world().size();
  std::vector<Layout> out;
  const auto add = [&](int64_t tp, int64_t pp, int64_t ep, int64_t vpp, bool sp,
                       const std::string& opt, const std::string& muon = "owner") {
    const int64_t dp = n / tp / pp;
    std::string name = "zero-" + opt + (opt == "muon" ? "-" + muon : "") + "-tp" +
                       std::to_string(tp) + "-pp" + std::to_string(pp) + "-dp" + std::to_string(dp);
    std::vector<std::string> sets = {"parallel.zero=true",
                                     "optim.name=" + opt,
                                     "optim.muon_distribution=" + muon,
                                     "parallel.tp=" + std::to_string(tp),
                                     "parallel.pp=" + std::to_string(pp),
                                     "parallel.ep=" + std::to_string(ep),
                                     "parallel.vpp=" + std::to_string(vpp)};
    if (ep > 1) name += "-ep" + std::to_string(ep);
    if (vpp > 1) name += "-vpp" + std::to_string(vpp);
    if (sp) {
      name += "-sp";
      sets.push_back("parallel.sequence_parallel=true");
    }
    out.push_back({name, sets, dp, opt});
  };
  if (n == 2) {
    add(2, 1, 1, 1, false, "muon");           // tp2: the tp-partial state sharded over the 2 ranks
    add(1, 2, 1, 1, false, "adamw");          // pp2
    add(2, 1, 1, 1, true, "muon", "gather");  // tp2 sp, Muon matrices cut by chunks
  } else if (n == 4) {
    add(2, 1, 1, 1, false, "muon");            // tp2 dp2
    add(4, 1, 1, 1, false, "muon", "gather");  // tp4: kv heads replicated over 2 ranks each
    add(1, 2, 1, 1, false, "adamw");           // pp2 dp2
    add(2, 2, 1, 2, true, "muon");             // interleaved pp2 tp2 sp
  } else {
    add(2, 2, 1, 1, false, "muon");            // dp2 tp2 pp2
    add(2, 2, 2, 1, true, "muon");             // pp2 ep2 tp2 sp (dp2): three optimizer parts
    add(2, 1, 2, 1, false, "adamw");           // tp2 ep2 dp4
    add(4, 1, 1, 1, false, "muon", "gather");  // tp4 dp2
  }
  return out;
}

TEST(ZeroLayouts, LossesEqualOneRank) {
  for (const Layout& l : zero_layouts()) {
    const Reference& ref = reference(l.optimizer, {"optim.name=" + l.optimizer});
    Trainer t(zero_config(kRows / l.dp, l.sets), run_dir(l.name), false, shared_world());
    const TrainResult r = t.run();
    // Every step's loss depends on every earlier update: a wrong shard, a
    // missing tp gather or a miscounted norm shows from step 2 on.
    test::expect_same_losses(r, ref.result, 0, 1e-5, l.name, true);
    EXPECT_LE(test::rel_diff(r.val_loss, ref.result.val_loss), 1e-5) << l.name;
  }
}

// The optimizer state is sharded: every ZeRO-1 part's state (the dense
// parameters' over dp, the tp-partial ones' over dp x tp) is cut, not
// copied, so the job's total stays the same when dp doubles inside the same
// tp and pp; replicated it would double.
TEST(ZeroLayouts, OptimizerStateIsCutNotCopiedOverDp) {
  const Layout l = zero_layouts().front();
  if (l.dp < 2)
    GTEST_SKIP() << "every ZeRO-1 layout with tp on " << world().size() << " ranks has dp 1";
  const auto tag = static_cast<size_t>(MemTag::optimizer);
  // Summed over the world's ranks.
  const auto optimizer_bytes = [&](std::shared_ptr<comm::Communicator> w, int64_t dp,
                                   const std::string& dir) {
    const int64_t before = cpu_allocator().stats().current[tag];
    // Flat buckets (the owner plan pads each chunk to its busiest owner's share).
    Trainer t(
        zero_config(kRows / dp, with(l.sets, {"train.steps=1", "optim.muon_distribution=gather"})),
        dir, false, std::move(w));
    Tensor bytes = Tensor::empty({1}, DType::f64, MemTag::comm);
    bytes.data<double>()[0] = static_cast<double>(t.run().first_step_memory.peak[tag] - before);
    world().allreduce(bytes, comm::ReduceOp::sum);
    return bytes.data<double>()[0];
  };
  const std::string all = run_dir("bytes-dp"), half0 = run_dir("bytes-half0"),
                    half1 = run_dir("bytes-half1");
  const double at_dp = optimizer_bytes(shared_world(), l.dp, all);
  // Two independent jobs on half the ranks each: the same tp and pp at dp / 2.
  const int half = world().rank() / (world().size() / 2);
  const double both_halves =
      optimizer_bytes(world().split(half, world().rank()), l.dp / 2, half ? half1 : half0);
  // One half job holds what the whole job holds (copied, the whole job would
  // hold twice as much), up to each chunk's padding and the AdamW second
  // moment, which every rank sizes for the chunk holding the most AdamW
  // elements (measured +4.2% at tp2 dp2).
  const double one_half = both_halves / 2.0;
  EXPECT_GE(at_dp, one_half) << l.name;
  EXPECT_LE(at_dp, 1.1 * one_half)
      << l.name << " (dp " << l.dp / 2 << ": " << one_half << " bytes)";
}

// Saved under ZeRO-1 in the first layout (each rank writing its chunks of
// its tp blocks as ranges of the blocks), resumed without ZeRO at another
// tp, and the one-rank checkpoint resumed under ZeRO-1 with tp and pp.
TEST(ZeroLayouts, CheckpointsResumeInAnotherLayout) {
  const std::vector<std::string> common = {"optim.name=muon", "checkpoint.every=5"};
  const Reference& ref = reference("ckpt", common);
  const Layout l = zero_layouts().front();
  const std::string saved = run_dir("ckpt-zero");
  {
    Trainer t(zero_config(kRows / l.dp, with(l.sets, common)), saved, false, shared_world());
    t.before_update = [](int64_t step) {
      if (step == 6) throw Error("stop after the step-5 checkpoint");
    };
    EXPECT_THROW(t.run(), Error);
  }
  if (world().rank() == 0) {
    // Rank 1 (tp rank 1 of the first dp replica) wrote its blocks' moments:
    // whole blocks at dp 1, ranges of them under dp > 1.
    ckpt::SafetensorsReader rank1(saved + "/checkpoints/step-5/optimizer-rank-1.safetensors");
    int64_t blocks = 0, ranges = 0;
    for (const std::string& name : rank1.names()) {
      const auto it = rank1.metadata().find(name);
      if (it == rank1.metadata().end() || it->second.rfind("block:", 0) != 0) continue;
      const size_t fields =
          static_cast<size_t>(std::count(it->second.begin(), it->second.end(), ',')) + 1;
      ++(fields == 7 ? ranges : blocks);
    }
    EXPECT_GT(blocks + ranges, 0) << "no tp block in rank 1's optimizer file";
    if (l.dp > 1) {
      EXPECT_GT(ranges, 0) << "no range of a tp block under dp " << l.dp;
    }
    // The masters are not gathered either: under dp > 1 the model files hold
    // chunks (ranges of tensors or of tp blocks), and the export assembles
    // the one-rank export's tensors from every rank's pieces.
    const nlohmann::json manifest =
        nlohmann::json::parse(std::ifstream(saved + "/checkpoints/step-5/manifest.json"))
            .at("state");
    int64_t master_ranges = 0;
    for (const auto& f : manifest.at("model_files")) {
      ckpt::SafetensorsReader file(saved + "/checkpoints/step-5/" + f.get<std::string>());
      for (const auto& [name, meta] : file.metadata()) {
        master_ranges +=
            meta.rfind("flat:", 0) == 0 || std::count(meta.begin(), meta.end(), ',') == 6;
      }
    }
    if (l.dp > 1) {
      EXPECT_GT(master_ranges, 0) << "no master weight chunk in the model files under dp " << l.dp;
    }
    const std::string one = job_dir() + "/runs/ref-ckpt-rank0/checkpoints/step-5";
    EXPECT_EQ(ckpt::export_hf(saved + "/checkpoints/step-5", saved + "/export", kTensorsOnly),
              ckpt::export_hf(one, saved + "/export-one", kTensorsOnly));
    ckpt::SafetensorsReader got(saved + "/export/model.safetensors"),
        want(saved + "/export-one/model.safetensors");
    EXPECT_EQ(got.names(), want.names());
    for (const std::string& name : want.names()) {
      if (!got.contains(name) || got.shape(name) != want.shape(name)) {
        ADD_FAILURE() << "export: " << name;
        continue;
      }
      const Tensor a = got.view(name), b = want.view(name);
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double d = a.data<float>()[i] - static_cast<double>(b.data<float>()[i]);
        diff += d * d;
        norm += static_cast<double>(b.data<float>()[i]) * b.data<float>()[i];
      }
      EXPECT_LE(std::sqrt(diff / std::max(norm, 1e-300)), 1e-5) << name;
    }
  }
  {
    // Without ZeRO on every rank as tp (x dp): e.g. saved at tp2 dp2 ZeRO, resumed at tp4.
    const int64_t tp = std::min<int64_t>(world().size(), 4), dp = world().size() / tp;
    Trainer t(zero_config(kRows / dp, with(common, {"parallel.tp=" + std::to_string(tp)})),
              copy_step5(saved, "ckpt-zero-to-tp"), true, shared_world());
    test::expect_same_losses(t.run(), ref.result, 5, 1e-5, l.name + " -> tp " + std::to_string(tp));
  }
  {
    const Layout other = zero_layouts().back();
    const std::string one = job_dir() + "/runs/ref-ckpt-rank0";
    Trainer t(zero_config(kRows / other.dp,
                          with(with(other.sets, {"optim.muon_distribution=owner"}), common)),
              copy_step5(one, "ckpt-one-to-zero"), true, shared_world());
    test::expect_same_losses(t.run(), ref.result, 5, 1e-5, "one rank -> " + other.name);
  }
}

// fp16 under tp: activations and their gradients are reduced over tp in
// fp32 and rounded to f16 once, where one rank rounds its whole GEMM output
// once, so the layouts differ from one rank by f16 rounding only.
TEST(ZeroLayouts, Fp16UnderTensorParallelTracksOneRank) {
  const int64_t n = world().size();
  const std::vector<std::string> fp16 = {"train.precision=fp16", "optim.name=adamw"};
  const Reference& ref = reference("fp16", fp16);
  std::vector<std::string> sets = {"parallel.tp=2"};
  if (n >= 4) sets.push_back("parallel.sequence_parallel=true");
  if (n >= 4) sets.push_back("parallel.zero=true");
  if (n == 8) sets.push_back("parallel.pp=2");
  const int64_t dp = n / 2 / (n == 8 ? 2 : 1);
  Trainer t(zero_config(kRows / dp, with(fp16, sets)), run_dir("fp16-tp"), false, shared_world());
  const TrainResult r = t.run();
  ASSERT_EQ(r.history.size(), ref.result.history.size());
  EXPECT_EQ(r.skipped_steps, ref.result.skipped_steps);
  for (size_t i = 0; i < r.history.size(); ++i) {
    EXPECT_LE(test::rel_diff(r.history[i].loss, ref.result.history[i].loss),
              i < 2 ? kFp16FirstSteps : kFp16Tolerance)
        << "fp16 tp step " << r.history[i].step;
  }
  EXPECT_LE(test::rel_diff(r.val_loss, ref.result.val_loss), kFp16Tolerance);
}

}  // namespace
}  // namespace moetron::train
