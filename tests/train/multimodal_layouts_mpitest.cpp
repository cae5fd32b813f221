// Multimodal training under mpirun (2 and 4 ranks): dp, ZeRO-1, tp (with and without
// sequence parallelism), pp and ep layouts of the tiny multimodal model
// compute what one rank computes (losses per step, validation loss,
// first-step gradients of every tensor, encoders included), with shared,
// prior and partitioned modality routing and GradNorm task weights; with
// prefix and gated cross-attention fusion together ("both") under dp, ep and
// tp (pp and sequence parallelism refuse cross-attention).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"
#include "util/tiny_multimodal.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

comm::Communicator& world() {
  return test::mpi_world();
}

// The job's directory with the multimodal corpus under mm/ (rank 0 makes it).
const std::string& job_dir() {
  static const std::string dir = [] {
    const std::string d = test::layout_job_dir("moetron_mm_layouts_");
    if (world().rank() == 0 && !fs::exists(d + "/mm")) test::make_tiny_multimodal_corpus(d + "/mm");
    world().barrier();
    return d;
  }();
  return dir;
}

constexpr int64_t kRows = 8;  // per micro-batch, over the dp ranks of a stage

Config config(int64_t rows, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {
      "train.steps=6",           "train.micro_batch=" + std::to_string(rows),
      "train.grad_accum=2",      "moe.bias_update_rate=0.001",
      "parallel.bucket_mb=0.02", "train.threads=1",
      "train.eval_batches=2",    "multitask.balance=gradnorm"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::tiny_multimodal_config(job_dir() + "/mm", sets);
}

const test::Reference& reference(const std::string& key, const std::vector<std::string>& extra) {
  return test::cached_reference(key, [&] {
    return test::run_reference(config(kRows, extra),
                               test::layout_run_dir(job_dir(), "ref-" + key, true));
  });
}

struct Routing {
  std::string name;
  std::vector<std::string> sets;
};

const std::vector<Routing> kRoutings = {
    {"shared", {}},
    {"prior", {"moe.modality_routing=prior"}},
    {"partitioned",
     {"moe.modality_routing=partitioned", "moe.modality_experts=1,1,1",
      "moe.modality_realloc_every=2", "moe.modality_local_entropy_coef=0.01",
      "moe.modality_global_entropy_coef=0.01", "moe.modality_global_entropy_threshold=0.5"}},
};

// With `grads` the first step's gradients are compared too; ZeRO-1 leaves
// each rank only its shard of the reduced gradients, so it is compared by
// every step's losses and the validation loss (which the gradients decide).
void run_layout(const std::string& name, int64_t dp, const std::vector<std::string>& layout,
                bool grads = true) {
  for (const Routing& r : kRoutings) {
    SCOPED_TRACE(name + " / " + r.name);
    const test::Reference& ref = reference(r.name, r.sets);
    std::vector<std::string> sets = r.sets;
    sets.insert(sets.end(), layout.begin(), layout.end());
    Trainer t(config(kRows / dp, sets), test::layout_run_dir(job_dir(), name + "-" + r.name), false,
              test::shared_world());
    if (grads) {
      test::expect_run_matches(t, ref, name + " / " + r.name, true);
      continue;
    }
    const TrainResult got = t.run();
    test::expect_same_losses(got, ref.result, 0, 1e-5, name + " / " + r.name, true);
    EXPECT_LE(test::rel_diff(got.val_loss, ref.result.val_loss), 1e-5);
  }
}

// Prefix and cross-attention fusion, a layer before blocks 1 and 3.
const std::vector<std::string> kBoth = {"multimodal.fusion=both",
                                        "multimodal.cross_attention_every=2"};

void run_cross_attention_layout(const std::string& name, int64_t dp,
                                const std::vector<std::string>& layout) {
  SCOPED_TRACE(name + " / both");
  const test::Reference& ref = reference("both", kBoth);
  std::vector<std::string> sets = kBoth;
  sets.insert(sets.end(), layout.begin(), layout.end());
  Trainer t(config(kRows / dp, sets), test::layout_run_dir(job_dir(), name + "-both"), false,
            test::shared_world());
  test::expect_run_matches(t, ref, name + " / both", true);
}

TEST(MultimodalLayouts, CrossAttentionUnderDataExpertAndTensorParallelismEqualsOneRank) {
  run_cross_attention_layout("dp", world().size(), {});
  run_cross_attention_layout("ep2", world().size(), {"parallel.ep=2"});
  run_cross_attention_layout("tp2", world().size() / 2, {"parallel.tp=2"});
}

TEST(MultimodalLayouts, DataParallelEqualsOneRank) {
  run_layout("dp", world().size(), {});
  run_layout("zero1", world().size(), {"parallel.zero=true"}, false);
}

TEST(MultimodalLayouts, TensorParallelEqualsOneRank) {
  const int64_t dp = world().size() / 2;
  run_layout("tp2", dp, {"parallel.tp=2"});
  run_layout("tp2-sp", dp, {"parallel.tp=2", "parallel.sequence_parallel=true"});
}

TEST(MultimodalLayouts, PipelineParallelEqualsOneRank) {
  run_layout("pp2", world().size() / 2, {"parallel.pp=2"});
}

TEST(MultimodalLayouts, ExpertParallelEqualsOneRank) {
  run_layout("ep2", world().size(), {"parallel.ep=2"});
}

}  // namespace
}  // namespace moetron::train
