// End-to-end single-process training on the tiny config: learning, exact
// resume, and the bad-input paths (missing corpus, corrupt checkpoint,
// failed save, NaN steps).
#include "moetron/train/trainer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/manifest.h"
#include "moetron/core/rng.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/corpus.h"
#include "moetron/data/tokenizer.h"
#include "moetron/train/generate.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

const std::string& corpus_dir() {
  static const std::string dir = [] {
    const std::string root = (fs::temp_directory_path() / ("moetron_trainer_" + std::to_string(::getpid()))).string();
    remove_tree(root);
    fs::create_directories(root + "/text");
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "while", "dogs", "bark", "at",
                           "night", "and", "stars", "shine", "over", "quiet", "hills", "river"};
    std::ofstream f(root + "/text/quotes");
    PhiloxStream rng(5, "corpus");
    for (int d = 0; d < 600; ++d) {
      // A learnable structure: each document repeats a short pattern.
      const int a = static_cast<int>(rng.next_u32() % 18), b = static_cast<int>(rng.next_u32() % 18);
      for (int l = 0; l < 3; ++l) f << words[a] << " " << words[b] << " " << words[(a + b) % 18] << ".\n";
      f << "%\n";
    }
    f.close();
    data::PrepareOptions o;
    o.input = root + "/text";
    o.out_dir = root + "/prepared";
    o.vocab_size = 300;
    o.val_fraction = 0.1;
    data::prepare_data(o);
    return root;
  }();
  return dir;
}

Config tiny_config(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"data.path=" + corpus_dir() + "/prepared"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

std::string run_dir(const std::string& name) {
  const std::string d = corpus_dir() + "/runs/" + name;
  remove_tree(d);
  return d;
}

TEST(Trainer, ThirtyStepsLowerTheLossClearly) {
  Trainer t(tiny_config({"train.eval_every=30"}), run_dir("learn"), false);
  const TrainResult r = t.run();
  ASSERT_EQ(r.steps_done, 30);
  EXPECT_LT(r.last_loss, r.first_loss - 1.0) << r.first_loss << " -> " << r.last_loss;
  EXPECT_TRUE(std::isfinite(r.val_loss));
}

TEST(Trainer, MetricsAndCheckpointFilesAreWritten) {
  const std::string dir = run_dir("files");
  Trainer t(tiny_config({"train.steps=4"}), dir, false);
  t.run();
  std::ifstream m(dir + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "expert_load", "dropped_slots"}) {
      EXPECT_TRUE(j.contains(k)) << k;
    }
    EXPECT_EQ(j.at("expert_load").size(), 3u);  // 4 layers, the first dense
    ++lines;
  }
  EXPECT_EQ(lines, 4);
  const std::string ck = ckpt::checkpoint_dir(dir, 4);
  EXPECT_NO_THROW(verify_manifest(ck));
  EXPECT_TRUE(fs::exists(ck + "/config.json"));
}

TEST(Trainer, ResumeIsBitExact) {
  const std::string a = run_dir("straight"), b = run_dir("resumed");
  const Config cfg = tiny_config({"train.steps=12", "checkpoint.every=6", "optim.name=muon"});
  Trainer ta(cfg, a, false);
  const TrainResult ra = ta.run();
  // Resume from step 6 of a copy of the run.
  fs::create_directories(b + "/checkpoints");
  fs::copy(ckpt::checkpoint_dir(a, 6), ckpt::checkpoint_dir(b, 6), fs::copy_options::recursive);
  Trainer tb(cfg, b, true);
  const TrainResult rb = tb.run();
  ASSERT_EQ(rb.steps_done, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rb.history[static_cast<size_t>(i)].loss, ra.history[static_cast<size_t>(6 + i)].loss) << i;
  EXPECT_EQ(file_checksum(ckpt::checkpoint_dir(a, 12) + "/model.safetensors"),
            file_checksum(ckpt::checkpoint_dir(b, 12) + "/model.safetensors"));
  EXPECT_EQ(file_checksum(ckpt::checkpoint_dir(a, 12) + "/state.safetensors"),
            file_checksum(ckpt::checkpoint_dir(b, 12) + "/state.safetensors"));
}

TEST(Trainer, CorruptCheckpointFallsBackToThePreviousOne) {
  const std::string dir = run_dir("corrupt");
  Trainer t(tiny_config({"train.steps=4", "checkpoint.every=2"}), dir, false);
  t.run();
  {  // flip a byte of the newest checkpoint's weights
    std::fstream f(ckpt::checkpoint_dir(dir, 4) + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x55');
  }
  std::vector<std::string> warnings;
  const auto latest = ckpt::latest_checkpoint(dir, &warnings);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, ckpt::checkpoint_dir(dir, 2));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("step-4"), std::string::npos) << warnings[0];
  // --resume continues from step 2, sets the damaged step-4 aside and saves a good one.
  Trainer resumed(tiny_config({"train.steps=4", "checkpoint.every=2"}), dir, true);
  EXPECT_EQ(resumed.run().steps_done, 2);
  EXPECT_TRUE(fs::exists(ckpt::checkpoint_dir(dir, 4) + ".corrupt"));
  EXPECT_NO_THROW(verify_manifest(ckpt::checkpoint_dir(dir, 4)));
}

TEST(Trainer, FailedSaveLeavesThePreviousCheckpointIntact) {
  const std::string dir = run_dir("diskfull");
  Trainer t(tiny_config({"train.steps=2"}), dir, false);
  t.run();
  const std::string good = ckpt::checkpoint_dir(dir, 2);
  const std::string sum = file_checksum(good + "/model.safetensors");
  // Simulate a full disk: files may not grow beyond 4 KB in this process.
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 4096;
  ::setrlimit(RLIMIT_FSIZE, &small);
  EXPECT_THROW(t.save_checkpoint(3), Error);
  ::setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_FALSE(fs::exists(ckpt::checkpoint_dir(dir, 3)));
  EXPECT_EQ(file_checksum(good + "/model.safetensors"), sum);
}

TEST(Trainer, MissingCorpusNamesThePath) {
  try {
    Trainer t(tiny_config({"data.path=/nonexistent/corpus"}), run_dir("missing"), false);
    FAIL() << "missing corpus accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus"), std::string::npos) << e.what();
  }
}

TEST(Trainer, NonFiniteStepsAreSkippedAndCountedOrStop) {
  Trainer t(tiny_config({"train.steps=6"}), run_dir("nan_skip"), false);
  t.before_update = [&](int64_t step) {
    if (step == 3) t.model().params().all()[0]->grad.data<float>()[0] = NAN;
  };
  const TrainResult r = t.run();
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_TRUE(r.history[2].skipped);
  EXPECT_TRUE(std::isfinite(r.last_loss));

  Trainer s(tiny_config({"train.steps=6", "train.nan_policy=stop"}), run_dir("nan_stop"), false);
  s.before_update = [&](int64_t step) {
    if (step == 4) s.model().params().all()[0]->grad.data<float>()[0] = INFINITY;
  };
  try {
    s.run();
    FAIL() << "stop policy did not stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 4"), std::string::npos) << e.what();
  }
}

TEST(Trainer, CapacityFactorDropsAreCounted) {
  // Capacity 1.0 with top-2 over 4 experts: any imbalance drops slots.
  Trainer t(tiny_config({"train.steps=2", "moe.capacity_factor=1.0"}), run_dir("capacity"), false);
  const TrainResult r = t.run();
  EXPECT_GT(r.history[0].dropped + r.history[1].dropped, 0);
  Trainer d(tiny_config({"train.steps=2"}), run_dir("dropless"), false);
  const TrainResult rd = d.run();
  EXPECT_EQ(rd.history[0].dropped + rd.history[1].dropped, 0);
}

TEST(Trainer, Fp16WithDynamicLossScalingLearnsAndSkipsOverflows) {
  // A deliberately huge initial scale: the first steps' fp16 gradients
  // overflow, are skipped and counted, and the scale halves until they fit.
  Trainer t(tiny_config({"train.precision=fp16", "train.steps=30", "train.loss_scale_init=16777216",
                         "train.loss_scale_window=5"}),
            run_dir("fp16"), false);
  const TrainResult r = t.run();
  EXPECT_GE(r.skipped_steps, 1);
  EXPECT_TRUE(r.history[0].skipped);
  EXPECT_FALSE(r.history.back().skipped);
  EXPECT_LT(r.history.back().loss_scale, 16777216.0);
  EXPECT_LT(r.last_loss, r.first_loss - 1.0) << r.first_loss << " -> " << r.last_loss;
  // The scale grows again after loss_scale_window clean steps.
  double lowest = 1e300;
  bool grew = false;
  for (const auto& h : r.history) {
    if (h.loss_scale > lowest) grew = true;
    lowest = std::min(lowest, h.loss_scale);
  }
  EXPECT_TRUE(grew);
}

TEST(Trainer, Fp16ResumeIsBitExactIncludingTheLossScale) {
  const std::string a = run_dir("fp16_straight"), b = run_dir("fp16_resumed");
  const Config cfg = tiny_config({"train.precision=fp16", "train.steps=8", "checkpoint.every=4",
                                  "train.loss_scale_window=3"});
  Trainer ta(cfg, a, false);
  const TrainResult ra = ta.run();
  fs::create_directories(b + "/checkpoints");
  fs::copy(ckpt::checkpoint_dir(a, 4), ckpt::checkpoint_dir(b, 4), fs::copy_options::recursive);
  Trainer tb(cfg, b, true);
  const TrainResult rb = tb.run();
  ASSERT_EQ(rb.steps_done, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rb.history[static_cast<size_t>(i)].loss, ra.history[static_cast<size_t>(4 + i)].loss) << i;
    EXPECT_EQ(rb.history[static_cast<size_t>(i)].loss_scale, ra.history[static_cast<size_t>(4 + i)].loss_scale) << i;
  }
  EXPECT_EQ(file_checksum(ckpt::checkpoint_dir(a, 8) + "/model.safetensors"),
            file_checksum(ckpt::checkpoint_dir(b, 8) + "/model.safetensors"));
}

TEST(Trainer, GenerateAndEvalFromACheckpoint) {
  const std::string dir = run_dir("generate");
  Trainer t(tiny_config({"train.steps=3"}), dir, false);
  t.run();
  LoadedModel lm = load_model(ckpt::checkpoint_dir(dir, 3));
  kernels::Context ctx(kernels::Backend::cpu);
  SampleOptions so;
  so.max_new_tokens = 5;
  const auto a = sample_tokens(ctx, *lm.model, {5, 6, 7}, so);
  const auto b = sample_tokens(ctx, *lm.model, {5, 6, 7}, so);
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(a, b);  // seeded sampling is reproducible
  const EvalResult r = evaluate_tokens(ctx, *lm.model, corpus_dir() + "/prepared/val.bin", 16, 4);
  EXPECT_GT(r.tokens, 0);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_GT(r.loss, 0.0);
}

TEST(Trainer, MissingTokenizerAndCheckpointNameThePath) {
  const auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([] { data::Tokenizer t("/nonexistent/tok.model"); }).find("/nonexistent/tok.model"),
            std::string::npos);
  EXPECT_NE(message([] { load_model("/nonexistent/step-5"); }).find("/nonexistent/step-5"), std::string::npos);
}

TEST(Trainer, AuxLossFreeBiasesMoveTowardBalance) {
  // With only the bias mechanism balancing (aux and z losses off), an
  // overloaded expert's bias goes down and an underloaded one's goes up.
  Trainer t(tiny_config({"train.steps=3", "moe.aux_loss_coef=0", "moe.z_loss_coef=0", "moe.bias_update_rate=0.01"}),
            run_dir("bias"), false);
  std::vector<std::vector<int64_t>> loads;
  t.before_update = [&](int64_t) { loads.push_back(t.model().moe_layers()[0]->expert_load()); };
  t.run();
  const Tensor& bias = t.model().moe_layers()[0]->bias();
  ASSERT_EQ(loads.size(), 3u);
  // Recompute the expected biases from the recorded loads.
  std::vector<double> expect(4, 0.0);
  for (const auto& l : loads) {
    double mean = 0;
    for (int64_t c : l) mean += static_cast<double>(c) / 4.0;
    for (size_t j = 0; j < 4; ++j) expect[j] += static_cast<double>(l[j]) > mean ? -0.01 : (static_cast<double>(l[j]) < mean ? 0.01 : 0.0);
  }
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(bias.data<float>()[j], expect[static_cast<size_t>(j)], 1e-6) << j;
}

}  // namespace
}  // namespace moetron::train
