// `moetron generate` and `moetron eval` on a tiny multimodal checkpoint, as
// a user runs them: a caption, a transcript and text printed; every task's
// metrics as one JSON line with values in range; and bad input (a missing
// PNG, a file that is no WAV, media for a text-only checkpoint, a task that
// does not fit the media) refused with an error naming the file or flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moetron/core/staged_dir.h"
#include "moetron/data/image_io.h"
#include "moetron/data/multimodal_format.h"
#include "moetron/data/wav_io.h"
#include "moetron/train/trainer.h"
#include "util/tiny_corpus.h"
#include "util/tiny_multimodal.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Fixture {
  std::string root, corpus, run, text_run, caption_png, asr_wav;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.root = (fs::temp_directory_path() / ("moetron_mmcli_" + std::to_string(::getpid()))).string();
    remove_tree(x.root);
    fs::create_directories(x.root);
    x.corpus = x.root + "/corpus";
    test::make_tiny_multimodal_corpus(x.corpus);
    x.run = x.root + "/run";
    train::Trainer(test::tiny_multimodal_config(x.corpus, {"train.steps=3", "checkpoint.every=3"}),
                   x.run, false)
        .run();
    x.text_run = x.root + "/text_run";
    train::Trainer(test::tiny_train_config({"train.steps=2", "checkpoint.every=2"}), x.text_run,
                   false)
        .run();
    // A val scene as a PNG and a tone as a WAV, the files a user brings.
    const auto ds = data::MultimodalDataset::open(x.corpus);
    const data::Record r = ds.record(data::Task::caption, data::Split::val, 0);
    x.caption_png = x.root + "/scene.png";
    data::write_png(x.caption_png,
                    data::Image{r.height, r.width, r.channels,
                                std::vector<uint8_t>(r.image.begin(), r.image.end())});
    data::Waveform w;
    for (int i = 0; i < 8000; ++i)
      w.samples.push_back(0.2f * std::sin(0.1f * static_cast<float>(i)));
    x.asr_wav = x.root + "/tone.wav";
    data::write_wav(x.asr_wav, w);
    return x;
  }();
  return f;
}

Outcome run(const std::string& args) {
  static int n = 0;
  const std::string base = fixture().root + "/cmd" + std::to_string(n++);
  const int status = std::system(
      (std::string(MOETRON_BINARY) + " " + args + " >" + base + ".out 2>" + base + ".err").c_str());
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

TEST(MultimodalCli, GenerateCaptionsAnImageTranscribesAudioAndSamplesText) {
  const Fixture& f = fixture();
  Outcome r =
      run("generate --checkpoint " + f.run + " --image " + f.caption_png + " --max-new-tokens 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.back(), '\n');
  r = run("generate --checkpoint " + f.run + " --image " + f.caption_png +
          " --task ocr --prompt 'the' --max-new-tokens 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("the", 0), 0u) << r.out;  // the --prompt text comes first
  r = run("generate --checkpoint " + f.run + " --audio " + f.asr_wav + " --max-new-tokens 4");
  EXPECT_EQ(r.code, 0) << r.err;
  r = run("generate --checkpoint " + f.run + " --record val:0 --task caption --max-new-tokens 4");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("reference: a "), std::string::npos) << r.err;
  // Text from a multimodal checkpoint reads its corpus's tokenizer.
  r = run("generate --checkpoint " + f.run + " --prompt 'hello' --max-new-tokens 3");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("hello"), std::string::npos) << r.out;
}

TEST(MultimodalCli, EvalPrintsEachTasksMetricsAsJson) {
  const Fixture& f = fixture();
  for (const char* task : {"caption", "ocr", "asr"}) {
    const Outcome r =
        run(std::string("eval --checkpoint ") + f.run + " --task " + task + " --max-new-tokens 6");
    ASSERT_EQ(r.code, 0) << task << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("task"), task);
    EXPECT_EQ(j.at("split"), "val");
    EXPECT_GE(j.at("examples").get<int64_t>(), 1);
    for (const char* k : {"exact_match", "word_accuracy", "word_f1", "char_accuracy"}) {
      const double v = j.at(k).get<double>();
      EXPECT_TRUE(v >= 0 && v <= 1) << task << " " << k << " " << v;
    }
    EXPECT_GE(j.at("cer").get<double>(), 0);
    EXPECT_GE(j.at("wer").get<double>(), 0);
  }
  Outcome r = run("eval --checkpoint " + f.run + " --task caption --split heldout --examples 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("examples"), 1);
  r = run("eval --checkpoint " + f.run + " --task lm --data " + f.corpus + " --examples 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const double loss = j.at("loss").get<double>();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0);
  EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
}

TEST(MultimodalCli, BadInputIsRefusedNamingTheFileOrFlag) {
  const Fixture& f = fixture();
  const std::string missing = f.root + "/no_such.png";
  Outcome r = run("generate --checkpoint " + f.run + " --image " + missing);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  const std::string bad_wav = f.root + "/bad.wav";
  std::ofstream(bad_wav) << "RIFF but not really";
  r = run("generate --checkpoint " + f.run + " --audio " + bad_wav);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(bad_wav), std::string::npos) << r.err;
  r = run("generate --checkpoint " + f.text_run + " --image " + f.caption_png);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--image"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("text-only"), std::string::npos) << r.err;
  r = run("eval --checkpoint " + f.text_run + " --task caption");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("text-only"), std::string::npos) << r.err;
  r = run("generate --checkpoint " + f.run + " --image " + f.caption_png + " --task asr");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--task"), std::string::npos) << r.err;
  r = run("generate --checkpoint " + f.run + " --image " + f.caption_png + " --audio " + f.asr_wav);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--audio"), std::string::npos) << r.err;
  r = run("eval --checkpoint " + f.run + " --task ocr --split heldout");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--split"), std::string::npos) << r.err;
  r = run("eval --checkpoint " + f.run + " --task video");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--task"), std::string::npos) << r.err;
  r = run("generate --checkpoint " + f.run);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--prompt"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moetron
