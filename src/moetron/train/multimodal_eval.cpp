#include "moetron/train/multimodal_eval.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "moetron/core/error.h"
#include "moetron/data/tokenizer.h"
#include "moetron/train/media_inputs.h"
#include "moetron/train/multimodal_generate.h"

namespace moetron::train {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

template <typename Seq>
int64_t levenshtein(const Seq& a, const Seq& b) {
  // One row of the dynamic programme: prev[j] = distance(a[0, i), b[0, j)).
  std::vector<int64_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int64_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({sub, prev[j] + 1, cur[j - 1] + 1});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

double ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

}  // namespace

std::string normalise_spaces(std::string_view text) {
  std::string out;
  bool gap = false;
  for (char c : text) {
    if (is_space(c)) {
      gap = !out.empty();
      continue;
    }
    if (gap) out += ' ';
    gap = false;
    out += c;
  }
  return out;
}

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  std::string w;
  for (char c : text) {
    if (!is_space(c)) {
      w += c;
    } else if (!w.empty()) {
      words.push_back(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) words.push_back(std::move(w));
  return words;
}

std::u32string utf8_code_points(std::string_view text) {
  std::u32string out;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    const int extra = b < 0x80           ? 0
                      : (b >> 5) == 0x6  ? 1
                      : (b >> 4) == 0xE  ? 2
                      : (b >> 3) == 0x1E ? 3
                                         : -1;
    char32_t cp = extra == 0 ? b : extra == 1 ? b & 0x1F : extra == 2 ? b & 0x0F : b & 0x07;
    bool ok = extra >= 0 && i + static_cast<size_t>(extra) < text.size();
    for (int k = 1; ok && k <= extra; ++k) {
      const auto c = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      ok = (c >> 6) == 0x2;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (ok) {
      out += cp;
      i += static_cast<size_t>(extra) + 1;
    } else {
      out += U'\uFFFD';
      ++i;
    }
  }
  return out;
}

int64_t edit_distance(const std::u32string& hypothesis, const std::u32string& reference) {
  return levenshtein(hypothesis, reference);
}

int64_t edit_distance(const std::vector<std::string>& hypothesis,
                      const std::vector<std::string>& reference) {
  return levenshtein(hypothesis, reference);
}

void TextScores::add(std::string_view hypothesis, std::string_view reference) {
  const std::string hyp = normalise_spaces(hypothesis), ref = normalise_spaces(reference);
  ++examples;
  exact += hyp == ref;
  const std::u32string hc = utf8_code_points(hyp), rc = utf8_code_points(ref);
  char_edits += edit_distance(hc, rc);
  ref_chars += static_cast<int64_t>(rc.size());
  const std::vector<std::string> hw = split_words(hyp), rw = split_words(ref);
  word_edits += edit_distance(hw, rw);
  ref_words += static_cast<int64_t>(rw.size());
  hyp_words += static_cast<int64_t>(hw.size());
  for (size_t i = 0; i < std::min(hw.size(), rw.size()); ++i) words_in_place += hw[i] == rw[i];
  std::map<std::string, int64_t> bag;
  for (const std::string& w : rw) ++bag[w];
  for (const std::string& w : hw) {
    auto it = bag.find(w);
    if (it != bag.end() && it->second > 0) {
      --it->second;
      ++words_shared;
    }
  }
}

double TextScores::exact_match() const {
  return ratio(exact, examples);
}
double TextScores::cer() const {
  return ratio(char_edits, ref_chars);
}
double TextScores::wer() const {
  return ratio(word_edits, ref_words);
}
double TextScores::word_accuracy() const {
  return ratio(words_in_place, ref_words);
}
double TextScores::word_f1() const {
  const double p = ratio(words_shared, hyp_words), r = ratio(words_shared, ref_words);
  return p + r > 0 ? 2 * p * r / (p + r) : 0.0;
}

MediaEvalResult evaluate_media_task(kernels::Context& ctx, nn::Transformer& model,
                                    const Config& cfg, const std::string& data_dir,
                                    const MediaEvalOptions& opts) {
  MOETRON_CHECK(opts.task != data::Task::text, "--task text has no media: use --task lm");
  MOETRON_CHECK(opts.examples >= 0, "--examples must be >= 0 (0: all), got ", opts.examples);
  const auto ds = data::MultimodalDataset::open(data_dir);
  const data::MultimodalManifest& m = ds.manifest();
  MOETRON_CHECK(m.vocab_size <= model.config().vocab_size, "multimodal corpus '", data_dir,
                "' has a vocabulary of ", m.vocab_size, " but the model's is ",
                model.config().vocab_size);
  const int64_t size = ds.size(opts.task, opts.split);
  MOETRON_CHECK(size > 0, "multimodal corpus '", data_dir, "' has no ",
                data::split_name(opts.split), " records of task '", data::task_name(opts.task),
                "' (--split)");
  const int64_t n = opts.examples > 0 ? std::min(opts.examples, size) : size;
  const data::Tokenizer tok(m.tokenizer_path);
  std::vector<MediaInput> items;
  std::vector<std::string> refs;
  for (int64_t i = 0; i < n; ++i) {
    const data::Record r = ds.record(opts.task, opts.split, i);
    items.push_back(media_input(r, cfg.multimodal.model, cfg.multimodal.audio_frames));
    refs.emplace_back(r.text);
  }
  SampleOptions so;
  so.temperature = 0;
  so.max_new_tokens = opts.max_new_tokens;
  so.stop_id = m.eos_id;
  const auto outs = generate_from_media(ctx, model, items, tok.encode(task_prompt_text(opts.task)),
                                        so, opts.batch);
  MediaEvalResult res;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string hyp = tok.decode(outs[i]);
    res.scores.add(hyp, refs[i]);
    if (i == 0) {
      res.first_hypothesis = normalise_spaces(hyp);
      res.first_reference = normalise_spaces(refs[i]);
    }
  }
  return res;
}

EvalResult evaluate_text_task(kernels::Context& ctx, nn::Transformer& model, const Config& cfg,
                              const std::string& data_dir, int64_t batch, int64_t rows) {
  MOETRON_CHECK(rows >= 0, "--examples must be >= 0 (0: all), got ", rows);
  const auto ds = data::MultimodalDataset::open(data_dir);
  model.set_multimodal(nullptr);
  return evaluate_tokens(ctx, model, ds.manifest().text_dir + "/val.bin", cfg.train.seq_len, batch,
                         rows);
}

nlohmann::json media_eval_json(const MediaEvalOptions& opts, const MediaEvalResult& r) {
  const TextScores& s = r.scores;
  return {{"task", data::task_name(opts.task)},
          {"split", data::split_name(opts.split)},
          {"examples", s.examples},
          {"exact_match", s.exact_match()},
          {"cer", s.cer()},
          {"char_accuracy", std::max(0.0, 1.0 - s.cer())},
          {"wer", s.wer()},
          {"word_accuracy", s.word_accuracy()},
          {"word_f1", s.word_f1()},
          {"first", {{"reference", r.first_reference}, {"hypothesis", r.first_hypothesis}}}};
}

}  // namespace moetron::train
