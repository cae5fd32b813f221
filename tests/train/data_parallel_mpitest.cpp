// Data parallelism under mpirun (2 and 4 ranks): with the global batch fixed,
// dp = world size computes what one rank computes (losses per step and the
// first step's gradients), ZeRO-1 equals plain dp, overlap on equals off, the
// gradient bytes on the wire are the analytic ones, and checkpoints resume
// bit-exactly at the same dp and re-cut at half the dp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "moetron/core/allocator.h"
#include "moetron/core/staged_dir.h"
#include "moetron/parallel/bucket_plan.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

comm::Communicator& world() {
  return test::mpi_world();
}

// One prepared corpus for the whole job (tests/util/layout_runs.h).
const std::string& job_dir() {
  return test::layout_job_dir("moetron_dp_");
}

// The tiny config with every balancing feature on; `rows` sequences per
// micro-batch on each rank, two micro-batches per step.
Config dp_config(int64_t rows, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"data.path=" + job_dir() + "/prepared",
                                   "train.steps=10",
                                   "train.micro_batch=" + std::to_string(rows),
                                   "train.grad_accum=2",
                                   "moe.bias_update_rate=0.001",
                                   "parallel.bucket_mb=0.02",
                                   "train.threads=1"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

constexpr int64_t kGlobalRows = 4;  // per micro-batch, over all ranks

int64_t dp() {
  return world().size();
}
using test::shared_world;

// A fresh run directory shared by the ranks (each rank-local one when `local`).
std::string run_dir(const std::string& name, bool local = false) {
  const std::string d =
      job_dir() + "/runs/" + name + (local ? "-rank" + std::to_string(world().rank()) : "");
  if (local || world().rank() == 0) remove_tree(d);
  world().barrier();
  return d;
}

double rel(double a, double b) {
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-30);
}

void expect_same_losses(const TrainResult& got, const TrainResult& want, double tol,
                        const char* what) {
  ASSERT_EQ(got.history.size(), want.history.size()) << what;
  for (size_t i = 0; i < got.history.size(); ++i) {
    EXPECT_LE(rel(got.history[i].loss, want.history[i].loss), tol)
        << what << " step " << i + 1 << ": " << got.history[i].loss << " vs "
        << want.history[i].loss;
  }
}

std::map<std::string, std::vector<float>> grads_of(Trainer& t) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& p : t.model().params().all()) {
    const float* g = p->grad.data<float>();
    out[p->name].assign(g, g + p->grad.numel());
  }
  return out;
}

// The one-rank reference, run by every rank on its own (local communicator).
struct Reference {
  TrainResult result;
  std::map<std::string, std::vector<float>> first_grads;
};
const Reference& reference(const std::string& optimizer) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(optimizer);
  if (it != cache.end()) return it->second;
  Reference ref;
  Trainer t(dp_config(kGlobalRows, {"optim.name=" + optimizer}), run_dir("ref-" + optimizer, true),
            false);
  t.before_update = [&](int64_t step) {
    if (step == 1) ref.first_grads = grads_of(t);
  };
  ref.result = t.run();
  return cache[optimizer] = std::move(ref);
}

TEST(DataParallel, LossesAndGradientsEqualOneRank) {
  for (const std::string opt : {"adamw", "muon"}) {
    const Reference& ref = reference(opt);
    Trainer t(dp_config(kGlobalRows / dp(), {"optim.name=" + opt}), run_dir("dp-" + opt), false,
              shared_world());
    std::map<std::string, std::vector<float>> grads;
    t.before_update = [&](int64_t step) {
      if (step == 1) grads = grads_of(t);
    };
    const TrainResult r = t.run();
    expect_same_losses(r, ref.result, 1e-5, opt.c_str());
    ASSERT_EQ(grads.size(), ref.first_grads.size());
    for (const auto& [name, g] : ref.first_grads) {
      double diff = 0, norm = 0;
      const auto& mine = grads.at(name);
      for (size_t i = 0; i < g.size(); ++i) {
        diff += (mine[i] - g[i]) * static_cast<double>(mine[i] - g[i]);
        norm += g[i] * static_cast<double>(g[i]);
      }
      EXPECT_LE(std::sqrt(diff / std::max(norm, 1e-300)), 1e-5) << opt << " " << name;
    }
  }
}

// ZeRO-1 with AdamW, with FlexMuon (owner-based: each matrix's Newton-Schulz
// on one rank) and with Moonlight's gathered distributed Muon.
TEST(DataParallel, ZeroOneEqualsPlainDataParallelAndShardsTheOptimizer) {
  for (const std::string variant : {"adamw", "muon-owner", "muon-gather"}) {
    const std::string opt = variant.substr(0, variant.find('-'));
    const std::string dist =
        variant.find('-') == std::string::npos ? "owner" : variant.substr(variant.find('-') + 1);
    const Reference& ref = reference(opt);
    const int64_t before = cpu_allocator().current(MemTag::optimizer);
    Trainer t(dp_config(kGlobalRows / dp(), {"optim.name=" + opt, "parallel.zero=true",
                                             "optim.muon_distribution=" + dist}),
              run_dir("zero-" + variant), false, shared_world());
    if (variant == "muon-owner") {
      // Every Muon matrix inside its owner's chunk.
      for (const auto& b : t.reducer()->buckets()) {
        for (const auto& slot : b.slots) {
          if (slot.owner < 0) continue;
          EXPECT_EQ(slot.offset / b.chunk, slot.owner) << slot.param->name;
          EXPECT_EQ((slot.offset + slot.numel - 1) / b.chunk, slot.owner) << slot.param->name;
        }
      }
    }
    // fp32 training: ZeRO-1 keeps an fp32 master and m of this rank's chunks
    // only, and v of their AdamW elements (as many as the fullest chunk holds).
    const int64_t optimizer_bytes = cpu_allocator().current(MemTag::optimizer) - before;
    const int64_t padded = t.reducer()->padded_numel();
    const auto buckets = static_cast<int64_t>(t.reducer()->buckets().size());
    int64_t v_elements = 0;
    for (const auto& b : t.reducer()->buckets()) {
      std::vector<std::pair<int64_t, int64_t>> adamw;
      for (const auto& slot : b.slots) {
        if (!optim::rule_uses_muon(t.optimizer().options(), *slot.param))
          adamw.emplace_back(slot.offset, slot.numel);
      }
      v_elements += parallel::max_chunk_share(adamw, b.chunk, dp());
    }
    if (opt == "adamw") {
      EXPECT_GE(v_elements, padded / dp() - buckets) << "AdamW: v covers (nearly) the whole chunk";
    }
    EXPECT_NEAR(static_cast<double>(optimizer_bytes),
                2.0 * 4.0 * static_cast<double>(padded) / static_cast<double>(dp()) +
                    4.0 * static_cast<double>(v_elements),
                3.0 * 64.0 * static_cast<double>(buckets))
        << variant;
    const TrainResult r = t.run();
    expect_same_losses(r, ref.result, 1e-5, variant.c_str());
  }
}

// bf16 hidden-matrix gradients (train.grad_dtype): the reducer widens them
// into its fp32 buckets, sums in fp32 and (all-reduce) rounds the sum back.
// Each rank's partial gradient was rounded to bf16 before the sum, one
// rank's full one once, so dp differs from one rank by bf16 roundings of
// the gradient (2^-8 relative), well inside 2% on 10 steps' losses.
TEST(DataParallel, Bf16GradientsAreReducedAndTrackOneRank) {
  const std::vector<std::string> bf16 = {"train.precision=bf16", "train.grad_dtype=bf16"};
  Trainer one(dp_config(kGlobalRows, bf16), run_dir("bf16-grads-ref", true), false);
  const TrainResult ref = one.run();
  for (const std::string zero : {"false", "true"}) {
    Trainer t(dp_config(kGlobalRows / dp(), test::with(bf16, {"parallel.zero=" + zero})),
              run_dir("bf16-grads-" + zero), false, shared_world());
    EXPECT_EQ(t.model().params().get("model.layers.0.self_attn.q_proj.weight").grad.dtype(),
              DType::bf16);
    const TrainResult r = t.run();
    expect_same_losses(r, ref, 2e-2, zero == "true" ? "bf16 grads, ZeRO-1" : "bf16 grads, dp");
  }
}

// bf16 masters (stochastically rounded) with 8-bit, factored optimizer
// state: every replica draws the same random bits for the same element, so
// after training the ranks hold bit-identical weights; the losses track one
// rank (the reduced gradient differs from one rank's by fp32 summation
// order, which can flip an element's rounding: measured far inside 2e-2).
TEST(DataParallel, Bf16MastersAndEightBitStateKeepReplicasIdentical) {
  const std::vector<std::string> modes = {"train.precision=bf16", "optim.master_dtype=bf16",
                                          "optim.moment_dtype=int8",
                                          "optim.second_moment=factored"};
  Trainer one(dp_config(kGlobalRows, modes), run_dir("low-memory-ref", true), false);
  const TrainResult ref = one.run();
  Trainer t(dp_config(kGlobalRows / dp(), modes), run_dir("low-memory"), false, shared_world());
  const TrainResult r = t.run();
  expect_same_losses(r, ref, 2e-2, "bf16 masters, int8 factored state, dp");
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const auto& p : t.model().params().all()) {
    const auto* bytes = static_cast<const unsigned char*>(p->value.raw());
    for (size_t i = 0; i < p->value.nbytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  Tensor h = Tensor::empty({2}, DType::i64);
  h.data<int64_t>()[0] = static_cast<int64_t>(hash >> 1);
  h.data<int64_t>()[1] = -static_cast<int64_t>(hash >> 1);
  world().allreduce(h, comm::ReduceOp::max);
  EXPECT_EQ(h.data<int64_t>()[0], -h.data<int64_t>()[1]) << "the replicas' weights differ";
}

// Recomputed segments report their gradients as they finish, so buckets still
// start during backward; the recomputed routing statistics are reduced again.
TEST(DataParallel, RecomputePoliciesUnderDataParallelEqualOneRank) {
  const Reference& ref = reference("adamw");
  for (const std::string policy : {"full", "sqrt", "selective"}) {
    Trainer t(dp_config(kGlobalRows / dp(), {"recompute.policy=" + policy}),
              run_dir("recompute-" + policy), false, shared_world());
    expect_same_losses(t.run(), ref.result, 1e-5, policy.c_str());
  }
}

TEST(DataParallel, OverlapOnEqualsOverlapOff) {
  TrainResult on, off;
  {
    Trainer t(dp_config(kGlobalRows / dp(), {"parallel.overlap=true"}), run_dir("overlap-on"),
              false, shared_world());
    on = t.run();
  }
  {
    Trainer t(dp_config(kGlobalRows / dp(), {"parallel.overlap=false"}), run_dir("overlap-off"),
              false, shared_world());
    off = t.run();
  }
  // The same reductions of the same buckets: bit-identical.
  ASSERT_EQ(on.history.size(), off.history.size());
  for (size_t i = 0; i < on.history.size(); ++i)
    EXPECT_EQ(on.history[i].loss, off.history[i].loss) << i;
}

// ZeRO-1's parameter all-gather completed bucket by bucket inside the next
// forward (the default) or at the end of the optimizer step: the same
// values, so bit-identical losses and weights. (A forward that did not wait
// would read the previous step's weights: tried, it fails here.)
TEST(DataParallel, ZeroParamGatherOverlapEqualsBlocking) {
  for (const std::string opt : {"adamw", "muon"}) {
    std::vector<TrainResult> runs;
    std::vector<std::vector<float>> weights;
    for (const std::string overlap : {"true", "false"}) {
      Trainer t(dp_config(kGlobalRows / dp(),
                          {"optim.name=" + opt, "parallel.zero=true", "parallel.bucket_mb=0.005",
                           "parallel.overlap_param_gather=" + overlap}),
                run_dir("zero-gather-" + overlap), false, shared_world());
      int64_t waited_in_forward = 0;
      auto inner = t.model().before_use;
      t.model().before_use = [&](nn::Parameter& p) {
        ++waited_in_forward;
        inner(p);
      };
      runs.push_back(t.run());
      EXPECT_GT(waited_in_forward, 0);
      std::vector<float> w;
      for (const auto& p : t.model().params().all()) {
        const float* v = p->value.data<float>();
        w.insert(w.end(), v, v + p->value.numel());
      }
      weights.push_back(std::move(w));
    }
    ASSERT_EQ(runs[0].history.size(), runs[1].history.size());
    for (size_t i = 0; i < runs[0].history.size(); ++i) {
      EXPECT_EQ(runs[0].history[i].loss, runs[1].history[i].loss) << opt << " step " << i + 1;
    }
    EXPECT_EQ(runs[0].val_loss, runs[1].val_loss) << opt;
    EXPECT_EQ(weights[0], weights[1]) << opt;
  }
}

// What the gradient communicator counts per step. A ring algorithm puts
// (n - 1) / n of a buffer on the wire per pass: allreduce = 2 passes
// (reduce-scatter + all-gather) over the padded fp32 bucket; ZeRO-1 =
// one reduce-scatter pass of the fp32 gradients, one all-gather pass of the
// working copies (fp32 here) and the 8-byte allreduce of the squared norm.
TEST(DataParallel, GradientBytesPerStepAreTheAnalyticValue) {
  const int64_t n = dp();
  for (const bool zero : {false, true}) {
    Trainer t(dp_config(kGlobalRows / dp(), {"train.steps=1", std::string("parallel.zero=") +
                                                                  (zero ? "true" : "false")}),
              run_dir(zero ? "bytes-zero" : "bytes"), false, shared_world());
    t.run();
    const comm::CommStats total = t.reducer()->comm().total_stats();
    int64_t want = 0;
    for (const auto& b : t.reducer()->buckets()) {
      const int64_t bytes = 4 * b.numel;
      want += 2 * (bytes * (n - 1) / n);
    }
    // (The checkpoint at the end gathers nothing: each rank writes its chunks of the masters.)
    if (zero) want += 2 * (8 * (n - 1) / n);
    EXPECT_EQ(total.bytes_sent, want) << (zero ? "zero-1" : "allreduce");
  }
}

TEST(DataParallel, ResumeIsBitExactAndReshardsToHalfTheRanks) {
  const std::vector<std::string> common = {"parallel.zero=true", "optim.name=muon",
                                           "train.steps=6"};
  TrainResult full;
  {
    Trainer t(dp_config(kGlobalRows / dp(), common), run_dir("resume-full"), false, shared_world());
    full = t.run();
  }
  const std::string dir = run_dir("resume-split");
  {
    // The same 6-step schedule, saved at step 3 and stopped there.
    std::vector<std::string> first = common;
    first.push_back("checkpoint.every=3");
    Trainer t(dp_config(kGlobalRows / dp(), first), dir, false, shared_world());
    t.before_update = [](int64_t step) {
      if (step == 4) throw Error("stop after the step-3 checkpoint");
    };
    EXPECT_THROW(t.run(), Error);
  }
  {
    Trainer t(dp_config(kGlobalRows / dp(), common), dir, true, shared_world());
    const TrainResult r = t.run();
    ASSERT_EQ(r.history.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(r.history[i].loss, full.history[3 + i].loss) << "same dp, step " << 4 + i;
  }
  // The step-3 checkpoint again, resumed by the first half of the ranks with
  // the same global batch: the optimizer shards are re-cut.
  const std::string half_dir = run_dir("resume-half");
  if (world().rank() == 0) {
    fs::create_directories(half_dir + "/checkpoints");
    fs::copy(dir + "/checkpoints/step-3", half_dir + "/checkpoints/step-3",
             fs::copy_options::recursive);
  }
  world().barrier();
  const int64_t half = dp() / 2;
  std::shared_ptr<comm::Communicator> group =
      world().split(world().rank() < half ? 0 : 1, world().rank());
  if (world().rank() < half) {
    Trainer t(dp_config(kGlobalRows / half, common), half_dir, true, group);
    const TrainResult r = t.run();
    ASSERT_EQ(r.history.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(rel(r.history[i].loss, full.history[3 + i].loss), 1e-5)
          << "dp " << half << ", step " << 4 + i;
    }
  }
  world().barrier();
}

}  // namespace
}  // namespace moetron::train

namespace moetron::train {
namespace {

// Compressed reductions with error feedback: residuals are checkpointed, so a
// resumed run continues bit for bit; the bytes on the wire are the encoded ones.
TEST(DataParallelCompression, ResumeWithCompressionIsBitExact) {
  for (const std::string mode : {"zero", "allreduce"}) {
    const std::vector<std::string> common = {
        std::string("parallel.zero=") + (mode == "zero" ? "true" : "false"), "optim.name=muon",
        "parallel.compression=int4", "parallel.compression_warmup=1", "train.steps=6"};
    TrainResult full;
    {
      Trainer t(dp_config(kGlobalRows / dp(), common), run_dir("ef-full-" + mode), false,
                shared_world());
      full = t.run();
    }
    const std::string dir = run_dir("ef-split-" + mode);
    {
      std::vector<std::string> first = common;
      first.push_back("checkpoint.every=3");
      Trainer t(dp_config(kGlobalRows / dp(), first), dir, false, shared_world());
      t.before_update = [](int64_t step) {
        if (step == 4) throw Error("stop after the step-3 checkpoint");
      };
      EXPECT_THROW(t.run(), Error);
    }
    Trainer t(dp_config(kGlobalRows / dp(), common), dir, true, shared_world());
    const TrainResult r = t.run();
    ASSERT_EQ(r.history.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(r.history[i].loss, full.history[3 + i].loss) << mode << " step " << 4 + i;
  }
}

// The 1-bit Adam recipe: sparse_sign started automatically (the rule made
// to fire at its earliest step: beta2 0.5 gives a 2-step window, so step
// 5 = max(lr warm-up 5, 2 W)), AdamW's second moment frozen from then on.
// Resumed from a checkpoint before the start and from one after it, the
// run continues bit for bit, starting compression at the same step.
// max_share: the compressed step's bytes on the dp communicator against an
// uncompressed step's (ZeRO-1's parameter all-gather stays fp32).
void check_automatic_start(const std::string& name, const std::vector<std::string>& extra,
                           double max_share) {
  std::vector<std::string> common = {"optim.beta2=0.5", "parallel.compression=sparse_sign",
                                     "parallel.compression_start=auto",
                                     "parallel.compression_start_tolerance=1e9", "train.steps=9"};
  common.insert(common.end(), extra.begin(), extra.end());
  const bool frozen =
      std::find(extra.begin(), extra.end(), "parallel.freeze_variance=true") != extra.end();
  const int64_t frozen_at = frozen ? 5 : 0;
  TrainResult full;
  std::vector<int64_t> full_bytes;
  {
    Trainer t(dp_config(kGlobalRows / dp(), common), run_dir(name + "-full"), false,
              shared_world());
    t.before_update = [&](int64_t) {
      full_bytes.push_back(t.reducer()->comm().total_stats().bytes_sent);
    };
    full = t.run();
    EXPECT_EQ(t.reducer()->compressing_from(), 6);
    EXPECT_EQ(t.optimizer().options().variance_frozen_at, frozen_at);
  }
  for (const auto& rec : full.history) EXPECT_TRUE(std::isfinite(rec.loss)) << "step " << rec.step;
  // Steps 7.. send sparse signs (step 6's count also holds the
  // preconditioner's one-off exchange).
  ASSERT_EQ(full_bytes.size(), 9u);
  const int64_t plain = full_bytes[1] - full_bytes[0], packed = full_bytes[7] - full_bytes[6];
  EXPECT_LT(static_cast<double>(packed), max_share * static_cast<double>(plain))
      << plain << " vs " << packed;
  for (const int64_t saved_at : {3, 7}) {
    const std::string dir = run_dir(name + "-split-" + std::to_string(saved_at));
    {
      std::vector<std::string> first = common;
      first.push_back("checkpoint.every=" + std::to_string(saved_at));
      Trainer t(dp_config(kGlobalRows / dp(), first), dir, false, shared_world());
      t.before_update = [saved_at](int64_t step) {
        if (step == saved_at + 1) throw Error("stop after the checkpoint");
      };
      EXPECT_THROW(t.run(), Error);
    }
    Trainer t(dp_config(kGlobalRows / dp(), common), dir, true, shared_world());
    const TrainResult r = t.run();
    ASSERT_EQ(r.history.size(), static_cast<size_t>(9 - saved_at));
    for (size_t i = 0; i < r.history.size(); ++i) {
      EXPECT_EQ(r.history[i].loss, full.history[static_cast<size_t>(saved_at) + i].loss)
          << "saved at " << saved_at << ", step " << saved_at + 1 + static_cast<int64_t>(i);
    }
    EXPECT_EQ(t.reducer()->compressing_from(), 6) << "saved at " << saved_at;
    EXPECT_EQ(t.optimizer().options().variance_frozen_at, frozen_at) << "saved at " << saved_at;
  }
}

TEST(DataParallelCompression, AutomaticStartFreezesTheVarianceAndResumesBitExact) {
  check_automatic_start("auto", {"optim.name=adamw", "parallel.freeze_variance=true"}, 0.1);
}

// The same in AdamW's update space (parallel.compression_space =
// "preconditioned"), with Muon (its matrices get one scale per tensor,
// kept in trainer.json) under ZeRO-1 (each rank holds part of the second
// moment): a resume rebuilds the same preconditioner, so it continues bit for bit.
TEST(DataParallelCompression, PreconditionedCompressionResumesBitExact) {
  check_automatic_start("auto-pre",
                        {"optim.name=muon", "parallel.zero=true", "parallel.freeze_variance=true",
                         "parallel.compression_space=preconditioned"},
                        0.55);
}

// With AdamW's second moment live, the scales follow v at every step
// (from the resumed v after a resume) with no extra communication.
TEST(DataParallelCompression, PreconditionedWithALiveVarianceResumesBitExact) {
  check_automatic_start("auto-live",
                        {"optim.name=adamw", "parallel.compression_space=preconditioned"}, 0.1);
}

TEST(DataParallelCompression, BytesOnTheWireAreTheEncodedSizes) {
  const int64_t n = dp();
  Trainer t(dp_config(kGlobalRows / dp(),
                      {"train.steps=1", "parallel.compression=topk", "parallel.topk_ratio=0.01"}),
            run_dir("ef-bytes"), false, shared_world());
  t.run();
  int64_t want = 0, fp32 = 0;
  for (const auto& b : t.reducer()->buckets()) {
    const int64_t enc = 8 * static_cast<int64_t>(std::ceil(0.01 * static_cast<double>(b.chunk)));
    want += (n * enc) * (n - 1) / n;  // all-to-all of the encoded chunks
    want += (n * enc) * (n - 1) / n;  // all-gather of the encoded sums
    fp32 += 2 * (4 * b.numel * (n - 1) / n);
  }
  EXPECT_EQ(t.reducer()->comm().total_stats().bytes_sent, want);
  EXPECT_GT(static_cast<double>(fp32) / static_cast<double>(want), 30.0);
}

}  // namespace
}  // namespace moetron::train
