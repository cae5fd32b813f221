// `moetron eval`: a checkpoint's mean next-token cross-entropy on a raw
// token file (--task lm --tokens, train/generate.h) or on a multimodal
// corpus's text validation tokens (--task lm of a multimodal checkpoint);
// its key-retrieval accuracy on a retrieval corpus's validation examples
// (--task retrieval, train/retrieval_eval.h); or a multimodal task's metrics
// decoded greedily from the corpus's media (--task caption|ocr|asr,
// train/multimodal_eval.h). Prints one JSON object.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace moetron::cli {

struct EvalCommand {
  std::string task = "lm";  // lm | retrieval | caption | ocr | asr
  std::string checkpoint, tokens, data;
  std::string split = "val";  // caption, ocr, asr: val | heldout (caption only)
  int64_t batch = 8;
  int64_t examples = 0;  // 0: every example (lm: every row)
  int64_t max_new_tokens = 48;
};

CLI::App* add_eval_command(CLI::App& app, EvalCommand& opts);
int run_eval_command(const EvalCommand& opts);

}  // namespace moetron::cli
