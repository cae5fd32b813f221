#include "moetron/cli/eval_cmd.h"

#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/error.h"
#include "moetron/data/multimodal_format.h"
#include "moetron/train/generate.h"
#include "moetron/train/multimodal_eval.h"
#include "moetron/train/retrieval_eval.h"

namespace moetron::cli {

namespace {

bool is_media_task(const std::string& t) {
  return t == "caption" || t == "ocr" || t == "asr";
}

int run_retrieval(kernels::Context& ctx, train::LoadedModel& lm, const EvalCommand& o) {
  const auto s = train::evaluate_retrieval(ctx, *lm.model, o.data, o.batch, o.examples);
  std::cout << nlohmann::json{{"task", "retrieval"},    {"accuracy", s.accuracy()},
                              {"correct", s.correct},   {"keys", s.keys},
                              {"examples", s.examples}, {"chance", s.chance}}
                   .dump()
            << "\n";
  return 0;
}

int run_lm(kernels::Context& ctx, train::LoadedModel& lm, const EvalCommand& o,
           const std::string& ckpt_dir) {
  if (!o.tokens.empty()) {
    const auto r =
        train::evaluate_tokens(ctx, *lm.model, o.tokens, lm.cfg.train.seq_len, o.batch, o.examples);
    std::cout << nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}}.dump() << "\n";
    return 0;
  }
  MOETRON_CHECK(lm.cfg.multimodal.model.enabled || !o.data.empty(), "--tokens is required by ",
                "--task lm for checkpoint '", ckpt_dir, "' (a text-only model; a multimodal one ",
                "reads its corpus's text validation tokens)");
  MOETRON_CHECK(o.split == "val", "--task lm reads the text validation tokens: --split must be ",
                "val, got '", o.split, "'");
  const std::string dir = o.data.empty() ? lm.cfg.multimodal.data : o.data;
  const auto r = train::evaluate_text_task(ctx, *lm.model, lm.cfg, dir, o.batch, o.examples);
  std::cout << nlohmann::json{{"task", "lm"},
                              {"split", "val"},
                              {"loss", r.loss},
                              {"perplexity", std::exp(r.loss)},
                              {"tokens", r.tokens}}
                   .dump()
            << "\n";
  return 0;
}

int run_media(kernels::Context& ctx, train::LoadedModel& lm, const EvalCommand& o,
              const std::string& ckpt_dir) {
  MOETRON_CHECK(lm.cfg.multimodal.model.enabled, "checkpoint '", ckpt_dir,
                "' is a text-only model (multimodal.enabled = false): --task ", o.task,
                " needs a multimodal checkpoint");
  train::MediaEvalOptions mo;
  mo.task = data::parse_task(o.task);
  try {
    mo.split = data::parse_split(o.split);
  } catch (const Error& e) {
    MOETRON_FAIL("--split: ", e.what());
  }
  MOETRON_CHECK(mo.split != data::Split::train, "--split must be val or heldout (caption), got '",
                o.split, "'");
  mo.examples = o.examples;
  mo.batch = o.batch;
  mo.max_new_tokens = o.max_new_tokens;
  const std::string dir = o.data.empty() ? lm.cfg.multimodal.data : o.data;
  const auto r = train::evaluate_media_task(ctx, *lm.model, lm.cfg, dir, mo);
  std::cout << train::media_eval_json(mo, r).dump() << "\n";
  return 0;
}

}  // namespace

CLI::App* add_eval_command(CLI::App& app, EvalCommand& o) {
  auto* ev = app.add_subcommand("eval",
                                "a checkpoint's next-token cross-entropy, retrieval accuracy, or a "
                                "multimodal task's metrics, as JSON");
  ev->add_option("--task", o.task,
                 "lm: mean cross-entropy on --tokens (a multimodal checkpoint: on its corpus's "
                 "text validation tokens); retrieval: key accuracy on --data; caption | ocr | "
                 "asr: exact match, character and word error rates, word accuracy and F1 of "
                 "greedy decoding");
  ev->add_option("--checkpoint", o.checkpoint, "checkpoint or run directory")->required();
  ev->add_option("--tokens", o.tokens, "lm: raw little-endian int32 token ids");
  ev->add_option("--data", o.data,
                 "retrieval: corpus from `prepare-data --task retrieval` (its val.bin); "
                 "multimodal tasks: corpus from `prepare-data --multimodal` (default: the run's "
                 "multimodal.data)");
  ev->add_option("--split", o.split,
                 "caption | ocr | asr: val, or heldout (caption: unseen colour-shape pairs)");
  ev->add_option("--batch", o.batch, "rows per forward pass");
  ev->add_option("--examples", o.examples,
                 "examples to score, the split's first N (0: all; lm: rows)");
  ev->add_option("--max-new-tokens", o.max_new_tokens,
                 "caption | ocr | asr: tokens decoded at most");
  return ev;
}

int run_eval_command(const EvalCommand& o) {
  MOETRON_CHECK(o.task == "lm" || o.task == "retrieval" || is_media_task(o.task),
                "--task must be 'lm' (cross-entropy), 'retrieval' (key accuracy on --data), or ",
                "'caption', 'ocr' or 'asr' (a multimodal task's metrics), got '", o.task, "'");
  MOETRON_CHECK(o.batch >= 1, "--batch must be >= 1, got ", o.batch);
  MOETRON_CHECK(o.examples >= 0, "--examples must be >= 0 (0: all), got ", o.examples);
  MOETRON_CHECK(o.max_new_tokens >= 1, "--max-new-tokens must be >= 1, got ", o.max_new_tokens);
  if (o.task == "retrieval")
    MOETRON_CHECK(!o.data.empty(), "--data is required by --task retrieval");
  kernels::Context ctx(kernels::Backend::cpu);
  const std::string ckpt_dir = ckpt::resolve_checkpoint_dir(o.checkpoint);
  train::LoadedModel lm = train::load_model(ckpt_dir);
  if (o.task == "retrieval") return run_retrieval(ctx, lm, o);
  if (o.task == "lm") return run_lm(ctx, lm, o, ckpt_dir);
  return run_media(ctx, lm, o, ckpt_dir);
}

}  // namespace moetron::cli
