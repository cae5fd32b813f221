// Multimodal training end to end in one process (train/trainer_multimodal.cpp):
// every task trains and is logged, the balancer moves the task weights,
// resume is bit-exact (balancer included), and bad settings name their key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/trainer.h"
#include "util/test_util.h"
#include "util/tiny_multimodal.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

const std::string& root() {
  static const std::string dir = [] {
    const std::string d =
        (fs::temp_directory_path() / ("moetron_mm_" + std::to_string(::getpid()))).string();
    fs::remove_all(d);
    fs::create_directories(d);
    test::make_tiny_multimodal_corpus(d + "/corpus");
    return d;
  }();
  return dir;
}

Config config(const std::vector<std::string>& extra = {}) {
  return test::tiny_multimodal_config(root() + "/corpus",
                                      test::with({"train.micro_batch=8"}, extra));
}

std::string run_dir(const std::string& name) {
  const std::string d = root() + "/runs/" + name;
  remove_tree(d);
  return d;
}

TEST(MultimodalTrainer, EveryTaskTrainsAndIsLogged) {
  const std::string dir = run_dir("learn");
  Trainer t(config({"train.steps=16", "train.eval_every=16"}), dir, false);
  const TrainResult r = t.run();
  ASSERT_EQ(r.history.size(), 16u);
  const auto mean = [&](size_t from) {
    double s = 0;
    for (size_t i = from; i < from + 3; ++i) s += r.history[i].loss;
    return s / 3;
  };
  EXPECT_LT(mean(13), mean(0) - 0.5) << "the loss did not fall";
  EXPECT_TRUE(std::isfinite(r.val_loss));
  // Every task drew samples in some step, and metrics.jsonl names them.
  std::set<std::string> seen;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("task_loss")) continue;
    for (const auto& [task, loss] : j.at("task_loss").items()) {
      EXPECT_TRUE(std::isfinite(loss.get<double>())) << task;
      seen.insert(task);
    }
    EXPECT_EQ(j.at("task_weight").size(), 4u);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"text", "caption", "ocr", "asr"}));
}

TEST(MultimodalTrainer, GradNormMovesTheWeightsAndKeepsTheirSum) {
  Trainer t(config({"train.steps=8", "multitask.balance=gradnorm", "train.micro_batch=16"}),
            run_dir("gradnorm"), false);
  const TrainResult r = t.run();
  const std::vector<double>& w = r.history.back().task_weight;
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0] + w[1] + w[2] + w[3], 4.0, 1e-9);
  EXPECT_GT(*std::max_element(w.begin(), w.end()) - *std::min_element(w.begin(), w.end()), 1e-3);
}

TEST(MultimodalTrainer, ResumeIsBitExact) {
  // The balancer's state and the partitioned routing's allocation resume too.
  const Config cfg = config({"train.steps=8", "checkpoint.every=4", "multitask.balance=dwa",
                             "moe.modality_routing=partitioned", "moe.modality_experts=1,1,1",
                             "moe.modality_realloc_every=3"});
  const std::string a = run_dir("straight"), b = run_dir("resumed");
  Trainer ta(cfg, a, false);
  const TrainResult ra = ta.run();
  fs::create_directories(b + "/checkpoints");
  fs::copy(ckpt::checkpoint_dir(a, 4), ckpt::checkpoint_dir(b, 4), fs::copy_options::recursive);
  Trainer tb(cfg, b, true);
  const TrainResult rb = tb.run();
  ASSERT_EQ(rb.steps_done, 4);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rb.history[i].loss, ra.history[4 + i].loss) << i;
    EXPECT_EQ(rb.history[i].task_weight, ra.history[4 + i].task_weight) << i;
  }
}

TEST(MultimodalTrainer, BadSettingsNameTheirKey) {
  EXPECT_NE(
      test::error_of([] { config({"multimodal.mix=text:1,video:2"}); }).find("multimodal.mix"),
      std::string::npos);
  EXPECT_NE(test::error_of([] { config({"multitask.balance=magic"}); }).find("multitask.balance"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              config({"multitask.dwa_temperature=0"});
            }).find("multitask.dwa_temperature"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              config({"multitask.uncertainty_lr=2.5"});
            }).find("multitask.uncertainty_lr"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              config({"moe.modality_routing=by_magic"});
            }).find("moe.modality_routing"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              config({"multitask.weights=ocr:2", "multimodal.mix=text:1"});
            }).find("multitask.weights"),
            std::string::npos);
  const std::string missing = test::error_of(
      [] { Trainer t(config({"multimodal.data=/nonexistent/mm"}), run_dir("missing"), false); });
  EXPECT_NE(missing.find("/nonexistent/mm"), std::string::npos) << missing;
}

}  // namespace
}  // namespace moetron::train
