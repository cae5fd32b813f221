// `moetron prepare-data --multimodal --out DIR`: the multimodal corpus,
// generated deterministically from the seed and what Debian ships:
//   text     the fortune corpus exactly as `prepare-data` makes it (DIR/text);
//            its tokenizer encodes every other task's target
//   caption  scenes of 1-3 coloured shapes -> their caption (data/scene_images.h);
//            train / val / heldout, heldout holding the colour-shape
//            combinations never seen in train or val
//   ocr      1-3 words of a fortune rendered with FreeType (data/text_render.h)
//            -> the text as rendered
//   asr      a 2-8 word fortune sentence spoken by espeak-ng at 16 kHz
//            (data/speech.h) as log-mel features (data/log_mel.h) -> the
//            sentence, lower case without punctuation
// Same options and seed -> byte-identical files. The directory is published
// atomically (core/staged_dir.h): a failed run leaves nothing under DIR and
// an existing DIR is never overwritten. Layout and reader: data/multimodal_format.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "moetron/data/log_mel.h"
#include "moetron/data/multimodal_format.h"
#include "moetron/data/scene_images.h"
#include "moetron/data/text_render.h"

namespace moetron::data {

struct MultimodalOptions {
  std::string input = "/usr/share/games/fortunes";
  std::string out_dir;          // must not exist yet
  std::string tokenizer_model;  // empty: train one on the text task's documents
  std::string font_dir = "/usr/share/fonts/truetype/dejavu";
  uint64_t seed = 1;
  int64_t vocab_size = 4096;
  double text_val_fraction = 0.05;  // the text task's validation share (by document hash)
  double val_fraction = 0.1;        // OCR / ASR texts in val (by text hash)
  // Train records per multimodal task; val (and caption's heldout) get
  // max(1, per_task / 10).
  int64_t per_task = 2000;
  // Train records of one task instead of per_task (indexed by Task; 0: per_task).
  // Scenes and rendered text cost milliseconds a thousand, speech seconds:
  // a corpus can hold many more of the first two.
  std::array<int64_t, 4> task_records{};
  int64_t records_per_shard = 4096;
  double max_audio_seconds = 3.0;  // longer utterances are skipped, never cut
  size_t max_ocr_chars = 16;
  int64_t export_samples = 0;  // first K train records of each task as PNG / WAV in DIR/samples
  SceneOptions scene;
  OcrOptions ocr;
  LogMelOptions mel;  // sample_rate 16000, n_mels 80 by default
};

struct MultimodalReport {
  std::array<std::array<int64_t, 3>, 4> records{};  // [task][split]
  std::array<double, 4> seconds{};                  // generation time per task
  int64_t text_train_tokens = 0, text_val_tokens = 0, vocab_size = 0;
  int64_t max_frames = 0;  // longest utterance in log-mel frames
};

// Validates the options (errors name the option), then generates and
// publishes the corpus.
MultimodalReport prepare_multimodal(const MultimodalOptions& opts);

// Records in `split` for a task of `per_task` train records.
int64_t split_records(int64_t per_task, Task t, Split s);

// The train records of task t: its task_records entry, else per_task.
int64_t train_records(const MultimodalOptions& o, Task t);

// "caption=20000,ocr=8000" -> task_records entries (caption, ocr, asr only);
// errors name --task-records and the bad entry.
std::array<int64_t, 4> parse_task_records(const std::string& spec);

}  // namespace moetron::data
