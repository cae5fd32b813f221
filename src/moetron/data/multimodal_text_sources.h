// The texts the OCR and ASR tasks are made of, cut from the fortune corpus:
// sentences (split at . ! ? and blank space), from which the OCR task takes
// runs of 1-3 words and the ASR task takes whole short sentences. Each text
// belongs to train or val by a hash of its content, so no text is in both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/data/multimodal_format.h"

namespace moetron::data {

struct TextSources {
  // Sentences of printable ASCII words (OCR phrases are cut from these).
  std::vector<std::vector<std::string>> ascii_sentences;
  // Sentences of 2-8 words of letters, apostrophes and commas, normalised for
  // ASR: lower case, commas and end punctuation dropped, single spaces.
  std::vector<std::string> spoken_sentences;
};

// Sentences of `documents`, each kept once, in order of first appearance.
TextSources extract_text_sources(const std::vector<std::string>& documents, int min_words = 2,
                                 int max_words = 8);

// Whether `text` belongs to `split` (train or val; val_fraction of texts by
// hash). Heldout counts as val.
bool text_in_split(const std::string& text, Split split, double val_fraction);

// A run of 1-3 consecutive words of a random sentence, at most max_chars
// long, in `split`; nullopt when this draw did not give one (draw again).
std::optional<std::string> draw_ocr_phrase(const TextSources& src, PhiloxStream& rng, Split split,
                                           double val_fraction, size_t max_chars);
// A random spoken sentence in `split`, nullopt when this draw did not give one.
std::optional<std::string> draw_asr_sentence(const TextSources& src, PhiloxStream& rng, Split split,
                                             double val_fraction);

}  // namespace moetron::data
