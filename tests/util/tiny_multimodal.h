// A tiny multimodal corpus (data/multimodal_prepare.h) for trainer tests:
// a dozen records per task from one small fortune file, scenes of 16 x 16,
// text lines of 16 x 32, speech as 16 mel bins; and configs/tiny.toml with
// encoders small enough for many runs inside `make test`.
#pragma once

#include <string>
#include <vector>

#include "moetron/train/config.h"

namespace moetron::test {

// Generates the corpus into `dir` (which must not exist).
void make_tiny_multimodal_corpus(const std::string& dir);
// configs/tiny.toml (seq_len 40) training on the corpus in `dir` with the
// four tasks, 8 x 8 pixel patches and audio clips of 32 frames, then `extra`.
train::Config tiny_multimodal_config(const std::string& dir,
                                     const std::vector<std::string>& extra = {});

}  // namespace moetron::test
