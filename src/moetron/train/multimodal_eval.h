// Task metrics of a multimodal checkpoint (`moetron eval --task
// caption|ocr|asr|lm`): every example of a split (or the first N) decoded
// greedily from its media (train/multimodal_generate.h) and scored against
// the record's text; lm: mean cross-entropy on the text task's validation
// tokens.
//
// Scores are over the whole split (corpus-level, not a mean of per-example
// rates), on texts with surrounding whitespace trimmed and runs of
// whitespace collapsed to one space:
//   exact_match    share of examples whose hypothesis equals the reference
//   cer            character edits (Levenshtein over Unicode code points) /
//                  reference characters
//   wer            word edits (Levenshtein over whitespace-separated words) /
//                  reference words
//   word_accuracy  reference words matched at the same position / reference words
//   word_f1        the harmonic mean of word precision and recall, matches
//                  counted as the multiset intersection of the two bags of words
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/data/multimodal_format.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"
#include "moetron/train/config.h"
#include "moetron/train/generate.h"

namespace moetron::train {

// Trimmed, inner whitespace runs collapsed to one space.
std::string normalise_spaces(std::string_view text);
std::vector<std::string> split_words(std::string_view text);
// UTF-8 to code points (a malformed byte becomes U+FFFD).
std::u32string utf8_code_points(std::string_view text);
// Levenshtein distance (insertions, deletions and substitutions cost 1).
int64_t edit_distance(const std::u32string& hypothesis, const std::u32string& reference);
int64_t edit_distance(const std::vector<std::string>& hypothesis,
                      const std::vector<std::string>& reference);

// The sums behind the metrics above, over the examples added.
struct TextScores {
  int64_t examples = 0, exact = 0;
  int64_t char_edits = 0, ref_chars = 0;
  int64_t word_edits = 0, ref_words = 0, hyp_words = 0;
  int64_t words_in_place = 0;  // hypothesis word i == reference word i
  int64_t words_shared = 0;    // multiset intersection of the two bags of words
  void add(std::string_view hypothesis, std::string_view reference);
  double exact_match() const;
  double cer() const;
  double wer() const;
  double word_accuracy() const;
  double word_f1() const;
};

struct MediaEvalOptions {
  data::Task task = data::Task::caption;  // caption, ocr or asr
  data::Split split = data::Split::val;
  int64_t examples = 0;  // the first N of the split (0: all)
  int64_t batch = 16;    // rows decoded together
  int64_t max_new_tokens = 48;
};

struct MediaEvalResult {
  TextScores scores;
  std::string first_hypothesis, first_reference;  // the first example, for a person to read
};

// Decodes the split's examples of a media task with `model` (a multimodal
// checkpoint's, built from `cfg`) from the corpus in `data_dir`. Errors
// name the task, split or directory.
MediaEvalResult evaluate_media_task(kernels::Context& ctx, nn::Transformer& model,
                                    const Config& cfg, const std::string& data_dir,
                                    const MediaEvalOptions& opts);

// Mean next-token cross-entropy on the text task's validation tokens of the
// corpus in `data_dir` (rows of train.seq_len + 1; the first `rows` of them, 0: all).
EvalResult evaluate_text_task(kernels::Context& ctx, nn::Transformer& model, const Config& cfg,
                              const std::string& data_dir, int64_t batch, int64_t rows);

// One JSON object for `moetron eval`: the task, split, examples and every metric.
nlohmann::json media_eval_json(const MediaEvalOptions& opts, const MediaEvalResult& r);

}  // namespace moetron::train
