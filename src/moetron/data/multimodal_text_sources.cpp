#include "moetron/data/multimodal_text_sources.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <unordered_set>

namespace moetron::data {

namespace {

bool printable_ascii(const std::string& w) {
  return std::all_of(w.begin(), w.end(), [](char c) { return c > 32 && c < 127; });
}

// A word of a spoken sentence: letters with inner apostrophes, a comma or
// end punctuation allowed at its end. Returns it lower-cased without the
// punctuation, or "" when it does not qualify (digits, symbols, ...).
std::string spoken_word(const std::string& w) {
  std::string core = w;
  while (!core.empty() &&
         (core.back() == ',' || core.back() == '.' || core.back() == '!' || core.back() == '?'))
    core.pop_back();
  if (core.empty() || !std::isalpha(static_cast<unsigned char>(core.front())) ||
      !std::isalpha(static_cast<unsigned char>(core.back())))
    return "";
  for (char& c : core) {
    if (c == '\'') continue;
    if (!std::isalpha(static_cast<unsigned char>(c))) return "";
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return core;
}

// Sentences of a document as word lists: words split on white space, a
// sentence ends after a word ending in . ! or ?.
std::vector<std::vector<std::string>> sentences_of(const std::string& doc) {
  std::vector<std::vector<std::string>> out(1);
  std::istringstream in(doc);
  std::string w;
  while (in >> w) {
    out.back().push_back(w);
    const char last = w.back();
    if (last == '.' || last == '!' || last == '?') out.emplace_back();
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

std::string join(const std::vector<std::string>& words, size_t first, size_t n) {
  std::string s;
  for (size_t i = first; i < first + n; ++i) s += (i > first ? " " : "") + words[i];
  return s;
}

}  // namespace

TextSources extract_text_sources(const std::vector<std::string>& documents, int min_words,
                                 int max_words) {
  TextSources src;
  std::unordered_set<std::string> seen_ascii, seen_spoken;
  for (const auto& doc : documents) {
    for (auto& words : sentences_of(doc)) {
      if (std::all_of(words.begin(), words.end(), printable_ascii) &&
          seen_ascii.insert(join(words, 0, words.size())).second)
        src.ascii_sentences.push_back(words);
      const auto n = static_cast<int>(words.size());
      if (n < min_words || n > max_words) continue;
      std::vector<std::string> spoken;
      for (const auto& w : words) spoken.push_back(spoken_word(w));
      if (std::any_of(spoken.begin(), spoken.end(), [](const auto& w) { return w.empty(); }))
        continue;
      std::string s = join(spoken, 0, spoken.size());
      if (seen_spoken.insert(s).second) src.spoken_sentences.push_back(std::move(s));
    }
  }
  return src;
}

bool text_in_split(const std::string& text, Split split, double val_fraction) {
  const auto threshold = static_cast<uint64_t>(val_fraction * 18446744073709551615.0);
  const bool val = XXH64(text.data(), text.size(), 0) < threshold;
  return split == Split::train ? !val : val;
}

std::optional<std::string> draw_ocr_phrase(const TextSources& src, PhiloxStream& rng, Split split,
                                           double val_fraction, size_t max_chars) {
  if (src.ascii_sentences.empty()) return std::nullopt;
  const auto& words = src.ascii_sentences[rng.next_u32() % src.ascii_sentences.size()];
  const size_t first = rng.next_u32() % words.size();
  const size_t n = std::min<size_t>(1 + rng.next_u32() % 3, words.size() - first);
  std::string phrase = join(words, first, n);
  if (phrase.size() > max_chars || !text_in_split(phrase, split, val_fraction)) return std::nullopt;
  return phrase;
}

std::optional<std::string> draw_asr_sentence(const TextSources& src, PhiloxStream& rng, Split split,
                                             double val_fraction) {
  if (src.spoken_sentences.empty()) return std::nullopt;
  const std::string& s = src.spoken_sentences[rng.next_u32() % src.spoken_sentences.size()];
  if (!text_in_split(s, split, val_fraction)) return std::nullopt;
  return s;
}

}  // namespace moetron::data
