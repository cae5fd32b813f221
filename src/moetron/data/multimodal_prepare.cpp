#include "moetron/data/multimodal_prepare.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/corpus.h"
#include "moetron/data/multimodal_text_sources.h"
#include "moetron/data/speech.h"
#include "moetron/data/tokenizer.h"

namespace moetron::data {

namespace fs = std::filesystem;

namespace {

// A draw (a text that does not fit, an utterance too long) may be rejected;
// this many rejections in a row mean the options cannot be satisfied.
constexpr int kMaxRejections = 100000;

// The first K train records of each task written for a person to look at:
// DIR/samples/<task>-NNNN.png|wav and samples/index.tsv (file, target text).
class SampleExporter {
 public:
  SampleExporter(std::string dir, int64_t k) : dir_(std::move(dir)), k_(k) {
    if (k_ > 0) fs::create_directories(dir_);
  }
  bool wants(Split s, int64_t i) const { return s == Split::train && i < k_; }
  void image(Task t, int64_t i, const Image& img, const std::string& text) {
    const std::string name = file_name(t, i, ".png");
    write_png(dir_ + "/" + name, img);
    index_ += name + "\t" + text + "\n";
  }
  void audio(int64_t i, const Waveform& w, const std::string& text) {
    const std::string name = file_name(Task::asr, i, ".wav");
    write_wav(dir_ + "/" + name, w);
    index_ += name + "\t" + text + "\n";
  }
  void finish() const {
    if (k_ > 0) write_file_atomically(dir_ + "/index.tsv", index_);
  }

 private:
  static std::string file_name(Task t, int64_t i, const char* ext) {
    char num[24];
    std::snprintf(num, sizeof(num), "%04lld", static_cast<long long>(i));
    return str_cat(task_name(t), "-", num, ext);
  }
  std::string dir_;
  int64_t k_;
  std::string index_;
};

struct Context {
  const MultimodalOptions& o;
  std::string dir;  // the staging directory
  const Tokenizer& tok;
  TextSources sources;
  SampleExporter samples;
  std::vector<std::string> files;  // written so far, relative to dir
  MultimodalReport report;
};

// Writes the records of (t, s), make(rng, s, i) building record i; returns
// the manifest entry of the split.
template <typename Make>
nlohmann::json write_split(Context& c, Task t, Split s, Make make) {
  ShardWriter writer(c.dir, t, s, c.o.records_per_shard);
  PhiloxStream rng(c.o.seed, str_cat("multimodal.", task_name(t), ".", split_name(s)));
  const int64_t n = split_records(train_records(c.o, t), t, s);
  for (int64_t i = 0; i < n; ++i) {
    RecordData r = make(rng, s, i);
    r.task = t;
    r.tokens = c.tok.encode(r.text);
    MOETRON_CHECK(!r.tokens.empty(), "the ", task_name(t), " target '", r.text,
                  "' encodes to no tokens");
    writer.append(r);
  }
  const std::vector<std::string> shards = writer.finish();
  for (const auto& name : shards) {
    c.files.push_back(name + ".bin");
    c.files.push_back(name + ".idx");
  }
  c.report.records[static_cast<size_t>(t)][static_cast<size_t>(s)] = n;
  return {{"records", n}, {"shards", shards}};
}

RecordData image_record(const Image& img, std::string text) {
  RecordData r;
  r.height = img.height, r.width = img.width, r.channels = img.channels;
  r.image = img.pixels;
  r.text = std::move(text);
  return r;
}

nlohmann::json write_captions(Context& c) {
  const auto heldout = heldout_combinations(c.o.seed);
  auto make = [&](PhiloxStream& rng, Split s, int64_t i) {
    Scene scene = generate_scene(rng, c.o.scene, heldout, s == Split::heldout);
    if (c.samples.wants(s, i)) c.samples.image(Task::caption, i, scene.image, scene.caption);
    return image_record(scene.image, scene.caption);
  };
  nlohmann::json splits;
  for (const Split s : kAllSplits) splits[split_name(s)] = write_split(c, Task::caption, s, make);
  nlohmann::json combos = nlohmann::json::array();
  for (const auto& [colour, kind] : heldout)
    combos.push_back(
        str_cat(scene_colours()[static_cast<size_t>(colour)].name, " ", shape_name(kind)));
  return {{"modality", "image"},
          {"shape", {c.o.scene.size, c.o.scene.size, 3}},
          {"shapes_per_scene", {c.o.scene.min_shapes, c.o.scene.max_shapes}},
          {"heldout_combinations", combos},
          {"splits", splits}};
}

nlohmann::json write_ocr(Context& c) {
  const std::vector<std::string> fonts = dejavu_fonts(c.o.font_dir);
  TextRenderer renderer(fonts);
  auto make = [&](PhiloxStream& rng, Split s, int64_t i) {
    for (int tries = 0; tries < kMaxRejections; ++tries) {
      const auto phrase = draw_ocr_phrase(c.sources, rng, s, c.o.val_fraction, c.o.max_ocr_chars);
      if (!phrase) continue;
      const auto img = render_ocr_image(renderer, *phrase, rng, c.o.ocr);
      if (!img) continue;
      if (c.samples.wants(s, i)) c.samples.image(Task::ocr, i, *img, *phrase);
      return image_record(*img, *phrase);
    }
    MOETRON_FAIL("no fortune text fits an OCR image of ", c.o.ocr.height, "x", c.o.ocr.width,
                 " (--input '", c.o.input, "')");
  };
  nlohmann::json splits;
  for (const Split s : {Split::train, Split::val})
    splits[split_name(s)] = write_split(c, Task::ocr, s, make);
  return {{"modality", "image"},
          {"shape", {c.o.ocr.height, c.o.ocr.width, 1}},
          {"fonts", fonts},
          {"pixel_sizes", {c.o.ocr.min_pixel_size, c.o.ocr.max_pixel_size}},
          {"max_noise", c.o.ocr.max_noise},
          {"max_chars", c.o.max_ocr_chars},
          {"splits", splits}};
}

nlohmann::json write_asr(Context& c) {
  const LogMel mel(c.o.mel);
  const int rate = c.o.mel.sample_rate;
  const auto max_samples = static_cast<size_t>(c.o.max_audio_seconds * rate);
  auto make = [&](PhiloxStream& rng, Split s, int64_t i) {
    for (int tries = 0; tries < kMaxRejections; ++tries) {
      const auto sentence = draw_asr_sentence(c.sources, rng, s, c.o.val_fraction);
      if (!sentence) continue;
      const SpeechStyle style = random_speech_style(rng);
      const Waveform wave = speak(*sentence, style, rate);
      if (wave.samples.size() > max_samples) continue;  // never cut a sentence
      if (c.samples.wants(s, i)) c.samples.audio(i, wave, *sentence);
      RecordData r;
      r.features = mel.compute(wave.samples);
      r.n_mels = c.o.mel.n_mels;
      r.frames = static_cast<int64_t>(r.features.size()) / r.n_mels;
      r.text = *sentence;
      c.report.max_frames = std::max(c.report.max_frames, r.frames);
      return r;
    }
    MOETRON_FAIL("no fortune sentence is spoken within --max-audio-seconds ", c.o.max_audio_seconds,
                 " (--input '", c.o.input, "')");
  };
  nlohmann::json splits;
  for (const Split s : {Split::train, Split::val})
    splits[split_name(s)] = write_split(c, Task::asr, s, make);
  const auto& m = c.o.mel;
  return {{"modality", "audio"},
          {"shape", {mel.frames(static_cast<int64_t>(max_samples)), m.n_mels, 0}},
          {"max_frames_written", c.report.max_frames},
          {"voices", speech_voices()},
          {"log_mel",
           {{"sample_rate", m.sample_rate},
            {"win_length", m.win_length},
            {"hop_length", m.hop_length},
            {"n_fft", m.n_fft},
            {"n_mels", m.n_mels},
            {"f_min", m.f_min},
            {"f_max", m.f_max},
            {"whisper_scaling", m.whisper_scaling}}},
          {"max_audio_seconds", c.o.max_audio_seconds},
          {"splits", splits}};
}

void validate(const MultimodalOptions& o) {
  MOETRON_CHECK(!o.out_dir.empty(), "--out is required");
  MOETRON_CHECK(o.per_task >= 1, "--per-task must be at least 1, got ", o.per_task);
  for (const Task t : {Task::caption, Task::ocr, Task::asr}) {
    MOETRON_CHECK(o.task_records[static_cast<size_t>(t)] >= 0, "--task-records: ", task_name(t),
                  " must not be negative (0: --per-task), got ",
                  o.task_records[static_cast<size_t>(t)]);
  }
  MOETRON_CHECK(o.task_records[static_cast<size_t>(Task::text)] == 0,
                "--task-records: the text task's size is its corpus, not a record count");
  MOETRON_CHECK(o.records_per_shard >= 1, "--records-per-shard must be at least 1, got ",
                o.records_per_shard);
  MOETRON_CHECK(o.val_fraction > 0 && o.val_fraction < 1, "the OCR/ASR val fraction must be in ",
                "(0, 1), got ", o.val_fraction);
  MOETRON_CHECK(o.max_audio_seconds > 0.5, "--max-audio-seconds must be above 0.5, got ",
                o.max_audio_seconds);
  MOETRON_CHECK(o.export_samples >= 0, "--export-samples must be >= 0, got ", o.export_samples);
  MOETRON_CHECK(o.mel.sample_rate == 16000, "speech is generated at 16 kHz");
  MOETRON_CHECK(o.scene.size >= 16 && o.scene.size <= 1024,
                "--scene-size must be in [16, 1024], got ", o.scene.size);
  MOETRON_CHECK(
      o.ocr.height >= 8 && o.ocr.width >= 8 && o.ocr.height <= 1024 && o.ocr.width <= 4096,
      "--ocr-height and --ocr-width must be in [8, 1024] and [8, 4096], got ", o.ocr.height,
      " and ", o.ocr.width);
  LogMel check_mel(o.mel);  // throws naming a bad n_mels
  MOETRON_CHECK(!fs::exists(o.out_dir), "output directory '", o.out_dir,
                "' already exists (nothing is overwritten)");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int64_t train_records(const MultimodalOptions& o, Task t) {
  const int64_t n = o.task_records[static_cast<size_t>(t)];
  return n > 0 ? n : o.per_task;
}

std::array<int64_t, 4> parse_task_records(const std::string& spec) {
  std::array<int64_t, 4> out{};
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    MOETRON_CHECK(eq != std::string::npos, "--task-records: '", item,
                  "' is not task=records (e.g. caption=20000)");
    const std::string name = item.substr(0, eq);
    MOETRON_CHECK(name != task_name(Task::text),
                  "--task-records: the text task's size is its corpus, not a record count");
    const std::array<Task, 3> media = {Task::caption, Task::ocr, Task::asr};
    const auto found =
        std::find_if(media.begin(), media.end(), [&](Task t) { return name == task_name(t); });
    MOETRON_CHECK(found != media.end(), "--task-records: unknown task '", name,
                  "': expected caption, ocr or asr");
    const Task t = *found;
    int64_t n = 0;
    const std::string count = item.substr(eq + 1);
    const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
    MOETRON_CHECK(ec == std::errc() && end == count.data() + count.size() && n >= 1,
                  "--task-records: ", task_name(t), "=", count, " is not a positive record count");
    out[static_cast<size_t>(t)] = n;
  }
  return out;
}

int64_t split_records(int64_t per_task, Task t, Split s) {
  if (t == Task::text) return 0;
  if (s == Split::train) return per_task;
  if (s == Split::heldout && t != Task::caption) return 0;
  return std::max<int64_t>(1, per_task / 10);
}

MultimodalReport prepare_multimodal(const MultimodalOptions& o) {
  validate(o);
  StagedDir staged(o.out_dir);
  auto t0 = std::chrono::steady_clock::now();
  PrepareOptions text;
  text.input = o.input;
  text.out_dir = staged.file("text");
  text.tokenizer_model = o.tokenizer_model;
  text.vocab_size = o.vocab_size;
  text.val_fraction = o.text_val_fraction;
  const PrepareReport text_report = prepare_data(text);
  const Tokenizer tok(staged.file("text/tokenizer.model"));
  Context c{o,
            staged.staging_path(),
            tok,
            extract_text_sources(read_documents(o.input)),
            SampleExporter(staged.file("samples"), o.export_samples),
            {},
            {}};
  c.report.text_train_tokens = text_report.train_tokens;
  c.report.text_val_tokens = text_report.val_tokens;
  c.report.vocab_size = tok.vocab_size();
  c.report.seconds[static_cast<size_t>(Task::text)] = seconds_since(t0);
  nlohmann::json tasks;
  t0 = std::chrono::steady_clock::now();
  tasks["caption"] = write_captions(c);
  c.report.seconds[static_cast<size_t>(Task::caption)] = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  tasks["ocr"] = write_ocr(c);
  c.report.seconds[static_cast<size_t>(Task::ocr)] = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  tasks["asr"] = write_asr(c);
  c.report.seconds[static_cast<size_t>(Task::asr)] = seconds_since(t0);
  c.samples.finish();
  for (const char* f : {"tokenizer.model", "train.bin", "val.bin", "manifest.json"})
    c.files.push_back(str_cat("text/", f));
  const nlohmann::json state = {{"format", "moetron-multimodal/1"},
                                {"seed", o.seed},
                                {"tokenizer", "text/tokenizer.model"},
                                {"text_dir", "text"},
                                {"vocab_size", tok.vocab_size()},
                                {"eos_id", tok.eos_id()},
                                {"bos_id", tok.bos_id()},
                                {"text",
                                 {{"train_tokens", text_report.train_tokens},
                                  {"val_tokens", text_report.val_tokens},
                                  {"documents", text_report.documents}}},
                                {"tasks", tasks},
                                {"options",
                                 {{"input", o.input},
                                  {"per_task", o.per_task},
                                  {"task_records",
                                   {{"caption", train_records(o, Task::caption)},
                                    {"ocr", train_records(o, Task::ocr)},
                                    {"asr", train_records(o, Task::asr)}}},
                                  {"val_fraction", o.val_fraction},
                                  {"text_val_fraction", o.text_val_fraction},
                                  {"records_per_shard", o.records_per_shard},
                                  {"export_samples", o.export_samples}}}};
  write_manifest(staged.staging_path(), c.files, state);
  staged.commit();
  return c.report;
}

}  // namespace moetron::data
