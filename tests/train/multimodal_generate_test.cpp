// Generation and task metrics of a multimodal checkpoint
// (train/multimodal_generate.h, train/multimodal_eval.h): the metric
// functions on hand-computed cases; then on a tiny trained run: its
// checkpoint loads with its encoders and reproduces the trained model's
// loss, a PNG reaches the encoder exactly as the record did, decoding stops
// at eos, at the token budget and at max_seq_len, rows decoded together
// equal rows decoded alone, and every task's metrics are in range.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/image_io.h"
#include "moetron/data/tokenizer.h"
#include "moetron/data/wav_io.h"
#include "moetron/nn/media_fusion.h"
#include "moetron/train/multimodal_batches.h"
#include "moetron/train/multimodal_eval.h"
#include "moetron/train/multimodal_generate.h"
#include "moetron/train/trainer.h"
#include "util/test_util.h"
#include "util/tiny_multimodal.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

TEST(MultimodalMetrics, EditDistancesOfHandComputedCases) {
  EXPECT_EQ(edit_distance(utf8_code_points("kitten"), utf8_code_points("sitting")), 3);
  EXPECT_EQ(edit_distance(utf8_code_points(""), utf8_code_points("abc")), 3);
  EXPECT_EQ(edit_distance(utf8_code_points("abc"), utf8_code_points("abc")), 0);
  // One code point each, however many bytes: é (2 bytes) for e is one edit.
  EXPECT_EQ(utf8_code_points("caf\xc3\xa9").size(), 4u);
  EXPECT_EQ(edit_distance(utf8_code_points("caf\xc3\xa9"), utf8_code_points("cafe")), 1);
  EXPECT_EQ(utf8_code_points("a\xff"), (std::u32string{U'a', U'\uFFFD'}));
  const auto w = [](const char* s) { return split_words(s); };
  EXPECT_EQ(w("  a  red\tcircle \n"), (std::vector<std::string>{"a", "red", "circle"}));
  EXPECT_EQ(edit_distance(w("the cat sat"), w("the cat sat down")), 1);
  EXPECT_EQ(edit_distance(w("a cat sat"), w("the cat sat on")), 2);
  EXPECT_EQ(edit_distance(w("x y z"), w("")), 3);
  EXPECT_EQ(normalise_spaces("  a \t b  "), "a b");
}

TEST(MultimodalMetrics, ScoresOfHandComputedExamples) {
  TextScores s;
  s.add("a red circle", " a red  circle ");        // exact after spacing
  s.add("a blue square", "a red square left of");  // 1 sub + 2 del of 5 words
  s.add("helo", "hello");                          // 1 char deletion of 5
  EXPECT_EQ(s.examples, 3);
  EXPECT_DOUBLE_EQ(s.exact_match(), 1.0 / 3);
  // Words: refs 3 + 5 + 1 = 9; edits 0 + 3 + 1 = 4.
  EXPECT_DOUBLE_EQ(s.wer(), 4.0 / 9);
  // Characters: "a red circle" 12, "a red square left of" 20, "hello" 5;
  // edits 0; "blue" -> "red" 4 (3 substitutions, 1 deletion) + " left of" 8; 1.
  EXPECT_EQ(s.ref_chars, 37);
  EXPECT_EQ(s.char_edits, 13);
  EXPECT_DOUBLE_EQ(s.cer(), 13.0 / 37);
  // In place: 3 + ("a", "square") 2 + 0; shared: 3 + 2 + 0; hyp words 3 + 3 + 1.
  EXPECT_DOUBLE_EQ(s.word_accuracy(), 5.0 / 9);
  const double p = 5.0 / 7, r = 5.0 / 9;
  EXPECT_DOUBLE_EQ(s.word_f1(), 2 * p * r / (p + r));
  // A repeated word counts as often as the reference has it.
  TextScores bag;
  bag.add("a a a", "a b");
  EXPECT_EQ(bag.words_shared, 1);
  EXPECT_DOUBLE_EQ(TextScores{}.wer(), 0.0);  // nothing added: no division by zero
}

// One tiny multimodal run (5 steps, a checkpoint at step 4) shared by the tests below.
struct TinyRun {
  std::string root, corpus, run;
  Config cfg;
  TrainResult result;
};

const TinyRun& tiny_run() {
  static const TinyRun r = [] {
    TinyRun t;
    t.root = (fs::temp_directory_path() / ("moetron_mmgen_" + std::to_string(::getpid()))).string();
    remove_tree(t.root);
    fs::create_directories(t.root);
    t.corpus = t.root + "/corpus";
    test::make_tiny_multimodal_corpus(t.corpus);
    t.cfg = test::tiny_multimodal_config(
        t.corpus, {"train.micro_batch=8", "train.steps=5", "checkpoint.every=4"});
    t.run = t.root + "/run";
    Trainer trainer(t.cfg, t.run, false);
    t.result = trainer.run();
    return t;
  }();
  return r;
}

TEST(MultimodalGenerate, ACheckpointLoadsItsEncodersAndReproducesTheTrainedLoss) {
  const TinyRun& t = tiny_run();
  ASSERT_EQ(t.result.history.size(), 5u);
  ASSERT_EQ(accumulation_steps(t.cfg, 1), 1);
  LoadedModel lm = load_model(ckpt::checkpoint_dir(t.run, 4));
  ASSERT_TRUE(lm.model->has_media());
  // Step 5's batch, through the weights after step 4: the loss step 5 logged.
  const MultimodalBatcher batcher(
      t.corpus, t.cfg.multimodal.model, parse_task_mix(t.cfg.multimodal.mix, "multimodal.mix"),
      t.cfg.train.seq_len, t.cfg.multimodal.audio_frames, t.cfg.train.seed);
  const int64_t mb = t.cfg.train.micro_batch, s = t.cfg.train.seq_len;
  std::vector<uint64_t> indices;
  for (int64_t r = 0; r < mb; ++r) indices.push_back(static_cast<uint64_t>(4 * mb + r));
  Tensor inputs = Tensor::empty({mb, s}, DType::i32), targets = Tensor::empty({mb, s}, DType::i32);
  auto mm = batcher.build(data::Split::train, indices, inputs, targets);
  mm->task_grad_scale.assign(static_cast<size_t>(batcher.num_tasks()), 1.0);
  ASSERT_FALSE(mm->media.empty());
  lm.model->set_multimodal(mm);
  kernels::Context ctx(kernels::Backend::cpu);
  const nn::LossStats st = lm.model->forward_backward(ctx, inputs, targets, 0, 0, false);
  const double loss = st.ce_sum / static_cast<double>(st.tokens);
  EXPECT_NEAR(loss, t.result.history[4].loss, 1e-5 * t.result.history[4].loss);
  // The loss depends on the loaded encoder weights: fresh ones differ.
  nn::Transformer fresh(lm.cfg.model, lm.cfg.moe, nn::Precision::fp32());
  fresh.enable_media(lm.cfg.multimodal.model);
  fresh.initialize(t.cfg.train.seed + 1);
  fresh.set_multimodal(mm);
  const nn::LossStats other = fresh.forward_backward(ctx, inputs, targets, 0, 0, false);
  EXPECT_GT(std::abs(other.ce_sum / static_cast<double>(other.tokens) - loss), 1e-3);
}

TEST(MultimodalGenerate, APngReachesTheEncoderExactlyAsItsRecordDid) {
  const TinyRun& t = tiny_run();
  const auto ds = data::MultimodalDataset::open(t.corpus);
  for (data::Task task : {data::Task::caption, data::Task::ocr}) {
    const data::Record r = ds.record(task, data::Split::val, 0);
    data::Image img{r.height, r.width, r.channels,
                    std::vector<uint8_t>(r.image.begin(), r.image.end())};
    const std::string png = t.root + "/" + data::task_name(task) + ".png";
    data::write_png(png, img);
    const MediaInput from_file = read_image_input(png, t.cfg.multimodal.model);
    const MediaInput from_record =
        media_input(r, t.cfg.multimodal.model, t.cfg.multimodal.audio_frames);
    EXPECT_EQ(from_file.shape, from_record.shape) << data::task_name(task);
    EXPECT_EQ(from_file.values, from_record.values) << data::task_name(task);
  }
}

std::vector<MediaInput> caption_inputs(const TinyRun& t, int64_t n) {
  const auto ds = data::MultimodalDataset::open(t.corpus);
  std::vector<MediaInput> items;
  for (int64_t i = 0; i < n; ++i)
    items.push_back(media_input(ds.record(data::Task::caption, data::Split::train, i),
                                t.cfg.multimodal.model, t.cfg.multimodal.audio_frames));
  return items;
}

TEST(MultimodalGenerate, DecodingStopsAtEosTheBudgetAndTheContext) {
  const TinyRun& t = tiny_run();
  LoadedModel lm = load_model(ckpt::checkpoint_dir(t.run, 4));
  kernels::Context ctx(kernels::Backend::cpu);
  const std::vector<MediaInput> items = caption_inputs(t, 1);
  const std::vector<int32_t> prompt = {5, 6};
  SampleOptions so;
  so.temperature = 0;
  so.max_new_tokens = 4;
  so.stop_id = -1;
  const auto four = generate_from_media(ctx, *lm.model, items, prompt, so);
  ASSERT_EQ(four.size(), 1u);
  ASSERT_EQ(four[0].size(), 4u);  // the budget
  for (int32_t id : four[0]) EXPECT_TRUE(id >= 0 && id < lm.cfg.model.vocab_size);
  // Greedy decoding stops at its own first token when that is the stop id.
  so.stop_id = four[0][0];
  EXPECT_TRUE(generate_from_media(ctx, *lm.model, items, prompt, so)[0].empty());
  so.stop_id = four[0][1];
  EXPECT_EQ(generate_from_media(ctx, *lm.model, items, prompt, so)[0],
            std::vector<int32_t>{four[0][0]});
  // The context: every input the model reads fits max_seq_len.
  so.stop_id = -1;
  so.max_new_tokens = 1000;
  const int64_t media =
      lm.model->media()->tokens_per_item(nn::Modality::image, items[0].shape[1], items[0].shape[2]);
  const int64_t room = lm.cfg.model.max_seq_len - media - static_cast<int64_t>(prompt.size());
  EXPECT_EQ(static_cast<int64_t>(generate_from_media(ctx, *lm.model, items, prompt, so)[0].size()),
            room + 1);
  // The model is left without media for a later text forward.
  Tensor ids = Tensor::zeros({1, 4}, DType::i32);
  EXPECT_NO_THROW(lm.model->last_logits(ctx, ids));
}

TEST(MultimodalGenerate, CrossAttentionRowsCarryNoPlaceholders) {
  const TinyRun& t = tiny_run();
  Config cfg = t.cfg;
  cfg.multimodal.model.fusion = "cross_attention";
  nn::Transformer model(cfg.model, cfg.moe, nn::Precision::fp32());
  model.enable_media(cfg.multimodal.model);
  model.initialize(3);
  kernels::Context ctx(kernels::Backend::cpu);
  SampleOptions so;
  so.temperature = 0;
  so.max_new_tokens = 1000;
  so.stop_id = -1;
  // Only the prompt precedes the generated tokens: the context allows
  // max_seq_len - prompt + 1 of them.
  const auto out = generate_from_media(ctx, model, caption_inputs(t, 1), {5, 6}, so);
  EXPECT_EQ(static_cast<int64_t>(out[0].size()), cfg.model.max_seq_len - 2 + 1);
}

TEST(MultimodalGenerate, RowsDecodedTogetherEqualRowsDecodedAlone) {
  const TinyRun& t = tiny_run();
  LoadedModel lm = load_model(ckpt::checkpoint_dir(t.run, 4));
  kernels::Context ctx(kernels::Backend::cpu);
  const std::vector<MediaInput> items = caption_inputs(t, 3);
  SampleOptions so;
  so.temperature = 0;
  so.max_new_tokens = 6;
  so.stop_id = 2;
  const auto together = generate_from_media(ctx, *lm.model, items, {7}, so, 3);
  const auto alone = generate_from_media(ctx, *lm.model, items, {7}, so, 1);
  EXPECT_EQ(together, alone);
}

TEST(MultimodalGenerate, AudioFromAWavFileAndBadFilesNameThemselves) {
  const TinyRun& t = tiny_run();
  LoadedModel lm = load_model(ckpt::checkpoint_dir(t.run, 4));
  const data::LogMelOptions mel =
      corpus_log_mel_options(t.corpus, lm.cfg.multimodal.model.audio.n_mels);
  EXPECT_EQ(mel.n_mels, 16);
  data::Waveform w;
  w.sample_rate = 22050;  // resampled to the corpus's 16 kHz
  for (int i = 0; i < 11025; ++i)
    w.samples.push_back(0.3f *
                        static_cast<float>(std::sin(2 * std::numbers::pi * 440 * i / 22050.0)));
  const std::string wav = t.root + "/tone.wav";
  data::write_wav(wav, w);
  const MediaInput in = read_audio_input(wav, mel, lm.cfg.multimodal.audio_frames);
  EXPECT_EQ(in.shape, (std::array<int64_t, 3>{32, 16, 0}));
  kernels::Context ctx(kernels::Backend::cpu);
  SampleOptions so;
  so.temperature = 0;
  so.max_new_tokens = 3;
  so.stop_id = -1;
  EXPECT_EQ(generate_from_media(ctx, *lm.model, {in}, {5}, so)[0].size(), 3u);

  const std::string bad = t.root + "/bad.wav";
  std::ofstream(bad) << "not a wave file at all";
  EXPECT_NE(test::error_of([&] { read_audio_input(bad, mel, 32); }).find(bad), std::string::npos);
  const std::string missing = t.root + "/missing.png";
  EXPECT_NE(
      test::error_of([&] { read_image_input(missing, lm.cfg.multimodal.model); }).find(missing),
      std::string::npos);
  // An image the encoder cannot split into patches names the file and vision.patch.
  const std::string odd = t.root + "/odd.png";
  data::write_png(odd, data::Image{12, 12, 3, std::vector<uint8_t>(12 * 12 * 3, 7)});
  const std::string e = test::error_of([&] { read_image_input(odd, lm.cfg.multimodal.model); });
  EXPECT_NE(e.find(odd), std::string::npos) << e;
  EXPECT_NE(e.find("vision.patch"), std::string::npos) << e;
  // A text-only model refuses media.
  nn::Transformer text(lm.cfg.model, lm.cfg.moe, nn::Precision::fp32());
  EXPECT_NE(test::error_of([&] {
              generate_from_media(ctx, text, {in}, {5}, so);
            }).find("multimodal.enabled"),
            std::string::npos);
}

TEST(MultimodalEval, EveryTaskScoresItsSplitWithMetricsInRange) {
  const TinyRun& t = tiny_run();
  LoadedModel lm = load_model(ckpt::checkpoint_dir(t.run, 4));
  kernels::Context ctx(kernels::Backend::cpu);
  const auto ds = data::MultimodalDataset::open(t.corpus);
  for (data::Task task : {data::Task::caption, data::Task::ocr, data::Task::asr}) {
    MediaEvalOptions o;
    o.task = task;
    o.max_new_tokens = 6;
    const MediaEvalResult r = evaluate_media_task(ctx, *lm.model, lm.cfg, t.corpus, o);
    EXPECT_EQ(r.scores.examples, ds.size(task, data::Split::val)) << data::task_name(task);
    for (double v : {r.scores.exact_match(), r.scores.word_accuracy(), r.scores.word_f1()})
      EXPECT_TRUE(v >= 0 && v <= 1) << data::task_name(task) << " " << v;
    EXPECT_GE(r.scores.cer(), 0);
    EXPECT_GE(r.scores.wer(), 0);
    EXPECT_FALSE(r.first_reference.empty());
    const nlohmann::json j = media_eval_json(o, r);
    EXPECT_EQ(j.at("task"), data::task_name(task));
  }
  MediaEvalOptions held;
  held.split = data::Split::heldout;
  held.examples = 5;  // at most the split's records
  held.max_new_tokens = 4;
  EXPECT_EQ(evaluate_media_task(ctx, *lm.model, lm.cfg, t.corpus, held).scores.examples,
            std::min<int64_t>(5, ds.size(data::Task::caption, data::Split::heldout)));
  held.task = data::Task::ocr;  // only captions have a heldout split
  EXPECT_NE(test::error_of([&] {
              evaluate_media_task(ctx, *lm.model, lm.cfg, t.corpus, held);
            }).find("--split"),
            std::string::npos);
  const EvalResult lmr = evaluate_text_task(ctx, *lm.model, lm.cfg, t.corpus, 4, 3);
  EXPECT_EQ(lmr.tokens, 3 * lm.cfg.train.seq_len);
  EXPECT_TRUE(std::isfinite(lmr.loss) && lmr.loss > 0);
}

}  // namespace
}  // namespace moetron::train
