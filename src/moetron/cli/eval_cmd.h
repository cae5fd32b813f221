// `moetron eval`: a checkpoint's mean next-token cross-entropy on a raw
// token file (--task lm, train/generate.h), or its key-retrieval accuracy
// on a retrieval corpus's validation examples (--task retrieval,
// train/retrieval_eval.h). Prints one JSON object.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace moetron::cli {

struct EvalCommand {
  std::string task = "lm";  // lm | retrieval
  std::string checkpoint, tokens, data;
  int64_t batch = 8;
  int64_t examples = 0;  // retrieval: 0 = every validation example
};

CLI::App* add_eval_command(CLI::App& app, EvalCommand& opts);
int run_eval_command(const EvalCommand& opts);

}  // namespace moetron::cli
