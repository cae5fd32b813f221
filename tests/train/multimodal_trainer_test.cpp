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
#include "moetron/ckpt/export.h"
#include "moetron/ckpt/safetensors.h"
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
  bool series = false;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("task_loss")) continue;
    // The registry's series carry the task weights and the modality loads.
    if (j.contains("series")) {
      const nlohmann::json& s = j.at("series");
      series = true;
      EXPECT_TRUE(s.contains(R"(moetron_task_weight{task="ocr"})")) << s.dump();
      EXPECT_TRUE(s.contains(
          R"(moetron_modality_expert_load_ratio{layer="1",modality="image",expert="0"})"))
          << s.dump();
    }
    for (const auto& [task, loss] : j.at("task_loss").items()) {
      EXPECT_TRUE(std::isfinite(loss.get<double>())) << task;
      seen.insert(task);
    }
    EXPECT_EQ(j.at("task_weight").size(), 4u);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"text", "caption", "ocr", "asr"}));
  EXPECT_TRUE(series);
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

TEST(MultimodalTrainer, PartitionedRoutingLogsTheOwnersEachStepRoutedUnder) {
  // metrics.jsonl's expert_owners are the owners a step routed under, so a
  // logged move shows in the next step's owners and nowhere else.
  const std::string dir = run_dir("owners");
  // Every layer an MoE layer (the list index is the layer number), top-1 so
  // that audio may own no expert; images (few tokens) own two, one of which
  // the text tokens take.
  Trainer t(config({"train.steps=10", "moe.first_dense_layers=0", "moe.top_k=1",
                    "moe.modality_routing=partitioned", "moe.modality_experts=1,2,0",
                    "moe.modality_realloc_every=2", "moe.modality_realloc_hysteresis=0"}),
            dir, false);
  t.run();
  std::ifstream metrics(dir + "/metrics.jsonl");
  nlohmann::json expected;
  int steps = 0, moves = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("task_loss")) continue;
    ASSERT_TRUE(j.contains("expert_owners")) << line;
    const nlohmann::json& owners = j.at("expert_owners");
    ASSERT_EQ(owners.size(), j.at("expert_load_by_modality").size());
    if (steps == 0) {
      EXPECT_EQ(owners[0], nlohmann::json({0, 1, 1, -1}));
    } else {
      EXPECT_EQ(owners, expected) << "step " << j.at("step");
    }
    expected = owners;
    for (const auto& mv : j.value("modality_moves", nlohmann::json::array())) {
      const std::string layer = mv.at("layer");
      const size_t l = std::stoul(layer.substr(layer.find("layers.") + 7));
      EXPECT_EQ(expected[l][mv.at("expert").get<size_t>()], mv.at("from"));
      expected[l][mv.at("expert").get<size_t>()] = mv.at("to");
      ++moves;
    }
    ++steps;
  }
  EXPECT_EQ(steps, 10);
  EXPECT_GT(moves, 0) << "no allocation moved: the test checks nothing";
}

TEST(MultimodalTrainer, TheEtaFollowsTheStepTimeNotTheTargetTokens) {
  // Caption rows predict only their caption: a token rate against full
  // rows (micro_batch x seq_len a step) would overstate the time left.
  Trainer t(config({"train.steps=3", "multimodal.mix=caption:1"}), run_dir("eta"), false);
  const TrainResult r = t.run();
  const StepRecord& first = r.history.front();
  const double full_rows = 8.0 * 40.0;  // micro_batch x seq_len
  ASSERT_LT(static_cast<double>(first.tokens), 0.8 * full_rows) << "rows of mostly targets";
  EXPECT_DOUBLE_EQ(eta_seconds(first, 3), 2 * first.step_s);
  const double by_tokens = 2 * full_rows / first.tokens_per_s;
  EXPECT_GT(by_tokens, 1.2 * eta_seconds(first, 3));
}

TEST(MultimodalTrainer, RecomputePoliciesGiveTheSameLossesAndBf16Trains) {
  const TrainResult none = Trainer(config({"train.steps=3"}), run_dir("rc-none"), false).run();
  for (const char* policy : {"selective", "full"}) {
    const TrainResult r =
        Trainer(config({"train.steps=3", std::string("recompute.policy=") + policy}),
                run_dir(std::string("rc-") + policy), false)
            .run();
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(r.history[i].loss, none.history[i].loss, 1e-6 * none.history[i].loss) << policy;
  }
  const TrainResult bf16 =
      Trainer(config({"train.steps=8", "train.precision=bf16"}), run_dir("bf16"), false).run();
  EXPECT_TRUE(std::isfinite(bf16.history.back().loss));
  EXPECT_LT(bf16.history.back().loss, bf16.history.front().loss);
}

TEST(MultimodalTrainer, ExportKeepsTheEncodersUnderTheirNames) {
  const std::string dir = run_dir("export");
  Trainer t(config({"train.steps=2", "moe.modality_routing=prior"}), dir, false);
  t.run();
  const std::string ckpt = ckpt::checkpoint_dir(dir, 2);
  const std::string refused = test::error_of([&] { ckpt::export_hf(ckpt, dir + "/hf"); });
  EXPECT_NE(refused.find("modality encoders"), std::string::npos) << refused;
  EXPECT_FALSE(fs::exists(dir + "/hf"));
  ckpt::export_hf(ckpt, dir + "/tensors", {true});
  const ckpt::SafetensorsReader tensors(dir + "/tensors/model.safetensors");
  for (const char* name : {"vision.patch_embed.weight", "vision.layers.0.self_attn.q_proj.weight",
                           "vision.projector.2.weight", "audio.conv1.weight", "audio.norm.weight",
                           "model.layers.1.block_sparse_moe.gate.modality_bias"})
    EXPECT_TRUE(tensors.contains(name)) << name;
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

TEST(MultimodalTrainer, CrossAttentionFusionTrainsAndOpensItsGates) {
  // fusion = cross_attention: rows carry no media positions, the layers
  // before blocks 1 and 3 read the encoders' tokens; the gates start at 0
  // and training opens them (AdamW, no weight decay on them).
  Trainer t(config({"train.steps=6", "multimodal.fusion=cross_attention",
                    "multimodal.cross_attention_every=2", "optim.weight_decay=0.1"}),
            run_dir("xattn"), false);
  const TrainResult r = t.run();
  ASSERT_EQ(r.history.size(), 6u);
  for (const auto& h : r.history) EXPECT_TRUE(std::isfinite(h.loss));
  nn::ParameterSet& params = t.model().params();
  EXPECT_EQ(params.find("model.layers.0.cross_attn.attn_gate"), nullptr);
  for (const char* gate :
       {"model.layers.1.cross_attn.attn_gate", "model.layers.3.cross_attn.mlp_gate"}) {
    const nn::Parameter* p = params.find(gate);
    ASSERT_NE(p, nullptr) << gate;
    EXPECT_NE(test::element(p->value, 0), 0.0) << gate;
  }
}

TEST(MultimodalTrainer, CrossAttentionSettingsNameTheirKey) {
  EXPECT_NE(test::error_of([] { config({"multimodal.fusion=late"}); }).find("multimodal.fusion"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              config({"multimodal.fusion=both", "multimodal.cross_attention_every=0"});
            }).find("multimodal.cross_attention_every"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              config({"multimodal.fusion=cross_attention", "parallel.pp=2"});
            }).find("parallel.pp"),
            std::string::npos);
  EXPECT_NE(
      test::error_of([] {
        config({"multimodal.fusion=both", "parallel.tp=2", "parallel.sequence_parallel=true"});
      }).find("parallel.sequence_parallel"),
      std::string::npos);
}

}  // namespace
}  // namespace moetron::train
