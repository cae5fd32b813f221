// A small prepared corpus for single-process training tests: 600 documents
// of three-word lines with a learnable pattern (vocabulary 300), prepared
// once per test process under /tmp/moetron_trainer_<pid>/prepared.
#pragma once

#include <string>
#include <vector>

#include "moetron/train/config.h"

namespace moetron::test {

// The process's scratch directory (holding prepared/), made on first use.
const std::string& tiny_corpus_root();
// configs/tiny.toml on the tiny corpus, then `extra` overrides.
train::Config tiny_train_config(const std::vector<std::string>& extra = {});

}  // namespace moetron::test
