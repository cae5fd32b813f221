#include "moetron/cli/eval_cmd.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/error.h"
#include "moetron/train/generate.h"
#include "moetron/train/retrieval_eval.h"

namespace moetron::cli {

CLI::App* add_eval_command(CLI::App& app, EvalCommand& o) {
  auto* ev = app.add_subcommand(
      "eval", "a checkpoint's next-token cross-entropy on a token file, or retrieval accuracy");
  ev->add_option("--task", o.task,
                 "lm: mean cross-entropy on --tokens; retrieval: key accuracy on --data");
  ev->add_option("--checkpoint", o.checkpoint, "checkpoint or run directory")->required();
  ev->add_option("--tokens", o.tokens, "lm: raw little-endian int32 token ids");
  ev->add_option("--data", o.data,
                 "retrieval: corpus from `prepare-data --task retrieval` (its val.bin)");
  ev->add_option("--batch", o.batch, "rows per forward pass");
  ev->add_option("--examples", o.examples, "retrieval: examples to score (0: all)");
  return ev;
}

int run_eval_command(const EvalCommand& o) {
  MOETRON_CHECK(o.task == "lm" || o.task == "retrieval", "--task must be 'lm' (cross-entropy on ",
                "--tokens) or 'retrieval' (key accuracy on --data), got '", o.task, "'");
  MOETRON_CHECK(o.batch >= 1, "--batch must be >= 1, got ", o.batch);
  if (o.task == "lm") MOETRON_CHECK(!o.tokens.empty(), "--tokens is required by --task lm");
  if (o.task == "retrieval")
    MOETRON_CHECK(!o.data.empty(), "--data is required by --task retrieval");
  kernels::Context ctx(kernels::Backend::cpu);
  train::LoadedModel lm = train::load_model(ckpt::resolve_checkpoint_dir(o.checkpoint));
  if (o.task == "retrieval") {
    const auto s = train::evaluate_retrieval(ctx, *lm.model, o.data, o.batch, o.examples);
    std::cout << nlohmann::json{{"task", "retrieval"},    {"accuracy", s.accuracy()},
                                {"correct", s.correct},   {"keys", s.keys},
                                {"examples", s.examples}, {"chance", s.chance}}
                     .dump()
              << "\n";
    return 0;
  }
  const auto r = train::evaluate_tokens(ctx, *lm.model, o.tokens, lm.cfg.train.seq_len, o.batch);
  std::cout << nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}}.dump() << "\n";
  return 0;
}

}  // namespace moetron::cli
