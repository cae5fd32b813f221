// moetron: train / eval / generate / prepare-data / memory / launch / export / report.
// Library code throws moetron::Error; this is the one place that turns an
// error into a message and a non-zero exit. Started by mpirun or srun, a
// rank prefixes its errors with "rank R: " and aborts every rank of the job,
// so one failing rank never leaves the others waiting in a collective.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/export.h"
#include "moetron/cli/memory_cmd.h"
#include "moetron/cli/metrics_cmd.h"
#include "moetron/cli/plan_cmd.h"
#include "moetron/cli/report_cmd.h"
#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/core/threading.h"
#include "moetron/data/corpus.h"
#include "moetron/data/tokenizer.h"
#include "moetron/train/fault_injection.h"
#include "moetron/train/generate.h"
#include "moetron/train/launcher.h"
#include "moetron/train/trainer.h"

namespace {

using namespace moetron;

int cmd_train(const std::string& config, const std::string& out,
              const std::vector<std::string>& sets, bool resume) {
  // Under mpirun / srun every rank joins the MPI world first, so that any
  // later error can abort the whole job.
  std::shared_ptr<comm::Communicator> world;
  if (comm::detect_launch_env().under_mpi) world = comm::make_mpi_world();
  train::maybe_inject_failure(world ? world->rank() : 0, 0);
  const train::Config cfg = train::load_config(config, sets);
  train::Trainer trainer(cfg, out, resume, world);
  const train::TrainResult r = trainer.run();
  if (world && world->rank() != 0) return 0;  // rank 0 reports for the job
  if (r.steps_done == 0) {
    std::cout << "nothing to train: the run in " << out
              << " has already reached train.steps = " << cfg.train.steps << "\n";
    return 0;
  }
  std::cout << "trained " << r.steps_done << " steps: loss " << r.first_loss << " -> "
            << r.last_loss << ", validation loss " << r.val_loss << " (" << r.skipped_steps
            << " skipped steps); run in " << out << "\n";
  return 0;
}

std::string tokenizer_for(const train::Config& cfg, const std::string& given) {
  const std::string path = given.empty() ? cfg.data.path + "/tokenizer.model" : given;
  return path;
}

int cmd_generate(const std::string& ckpt_dir, const std::string& prompt,
                 const std::string& tok_path, int64_t max_new, double temperature, int64_t top_k,
                 uint64_t seed) {
  kernels::Context ctx(kernels::Backend::cpu);
  train::LoadedModel lm = train::load_model(ckpt_dir);
  data::Tokenizer tok(tokenizer_for(lm.cfg, tok_path));
  train::SampleOptions so;
  so.max_new_tokens = max_new;
  so.temperature = temperature;
  so.top_k = top_k;
  so.seed = seed;
  so.stop_id = tok.eos_id();
  std::vector<int32_t> ids = tok.encode(prompt);
  if (ids.empty()) ids.push_back(tok.eos_id());
  const auto out = train::sample_tokens(ctx, *lm.model, ids, so);
  // Decoding prompt and continuation together keeps the spacing between them.
  std::vector<int32_t> all = ids;
  all.insert(all.end(), out.begin(), out.end());
  std::cout << tok.decode(all) << "\n";
  return 0;
}

int cmd_eval(const std::string& ckpt_dir, const std::string& tokens, int64_t batch) {
  kernels::Context ctx(kernels::Backend::cpu);
  train::LoadedModel lm = train::load_model(ckpt_dir);
  const auto r = train::evaluate_tokens(ctx, *lm.model, tokens, lm.cfg.train.seq_len, batch);
  std::cout << nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}}.dump() << "\n";
  return 0;
}

int cmd_prepare(const data::PrepareOptions& opts) {
  const data::PrepareReport r = data::prepare_data(opts);
  std::cout << "prepared " << opts.out_dir << ": " << r.files << " files, " << r.documents
            << " documents, " << r.bytes << " bytes -> " << r.train_tokens << " train + "
            << r.val_tokens << " validation tokens, vocabulary " << r.vocab_size << "\n";
  return 0;
}

struct TrainCommand {
  std::string config, out;
  std::vector<std::string> sets;
  bool resume = false;
  bool dry_run = false;
  int64_t ranks = 1;  // planned by --dry-run
};

CLI::App* add_train_command(CLI::App& app, TrainCommand& o) {
  auto* train = app.add_subcommand("train", "train a model from a TOML config");
  train->add_option("--config", o.config, "TOML config file")->required();
  train->add_option("--out", o.out,
                    "run directory (metrics, checkpoints); required unless --dry-run");
  train->add_option("--set", o.sets, "override a config key: key=value (repeatable)");
  train->add_flag("--resume", o.resume, "continue from the latest complete checkpoint in --out");
  train->add_flag("--dry-run", o.dry_run,
                  "print the plan for -n ranks (as `moetron plan`) and train nothing");
  train->add_option("-n,--ranks", o.ranks, "ranks planned by --dry-run");
  return train;
}

int run_train_command(const TrainCommand& o) {
  if (o.dry_run) {
    cli::PlanCommand p;
    p.config = o.config;
    p.sets = o.sets;
    p.ranks = o.ranks;
    return cli::run_plan_command(p);
  }
  MOETRON_CHECK(!o.out.empty(), "moetron train needs --out RUN_DIR (or --dry-run)");
  return cmd_train(o.config, o.out, o.sets, o.resume);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moetron: train Mixture-of-Experts transformers"};
  app.require_subcommand(1);

  TrainCommand train_opts;
  auto* train = add_train_command(app, train_opts);

  auto* gen = app.add_subcommand("generate", "sample text from a checkpoint");
  std::string ckpt_dir, prompt, tok_path;
  int64_t max_new = 100, top_k = 40;
  double temperature = 0.8;
  uint64_t seed = 1;
  gen->add_option("--checkpoint", ckpt_dir, "checkpoint directory (RUN/checkpoints/step-N)")
      ->required();
  gen->add_option("--prompt", prompt, "text to continue")->required();
  gen->add_option("--tokenizer", tok_path, "tokenizer .model (default: the run's data.path)");
  gen->add_option("--max-new-tokens", max_new, "tokens to generate");
  gen->add_option("--temperature", temperature, "sampling temperature (0: greedy)");
  gen->add_option("--top-k", top_k, "sample among the k most likely tokens");
  gen->add_option("--seed", seed, "sampling seed");

  auto* ev = app.add_subcommand("eval", "mean next-token cross-entropy on a raw int32 token file");
  std::string tokens;
  int64_t eval_batch = 8;
  ev->add_option("--checkpoint", ckpt_dir, "checkpoint directory")->required();
  ev->add_option("--tokens", tokens, "raw little-endian int32 token ids")->required();
  ev->add_option("--batch", eval_batch, "rows per forward pass");

  auto* prep = app.add_subcommand("prepare-data", "tokenise a text corpus for training");
  data::PrepareOptions popts;
  prep->add_option("--input", popts.input, "text file or folder of text files")->required();
  prep->add_option("--out", popts.out_dir, "output directory (must not exist)")->required();
  prep->add_option("--tokenizer", popts.tokenizer_model,
                   "existing SentencePiece .model (default: train one)");
  prep->add_option("--vocab-size", popts.vocab_size, "vocabulary size of a trained tokenizer");
  prep->add_option("--val-fraction", popts.val_fraction,
                   "share of documents held out for validation");

  cli::PlanCommand plan_opts;
  auto* plan = cli::add_plan_command(app, plan_opts);
  cli::MetricsCommand metrics_opts;
  auto* metrics = cli::add_metrics_command(app, metrics_opts);
  cli::MemoryCommand memory_opts;
  auto* memory = cli::add_memory_command(app, memory_opts);
  cli::ReportCommand report_opts;
  auto* report = cli::add_report_command(app, report_opts);
  auto* launch =
      app.add_subcommand("launch", "run a moetron command on N ranks of this machine under mpirun");
  train::LaunchOptions lopts;
  launch->add_option("-n,--ranks", lopts.ranks, "number of ranks")->required();
  launch->add_option("--threads-per-rank", lopts.threads_per_rank,
                     "OpenMP threads per rank (default: cores / N)");
  launch
      ->add_option("command", lopts.command,
                   "after `--`: the moetron command, e.g. train --config C --out RUN")
      ->required();

  auto* exp = app.add_subcommand(
      "export", "write a checkpoint of any layout as one Hugging Face Mixtral directory");
  std::string export_out;
  exp->add_option("--checkpoint", ckpt_dir, "checkpoint directory (RUN/checkpoints/step-N)")
      ->required();
  exp->add_option("--out", export_out, "output directory (must not exist)")->required();

  CLI11_PARSE(app, argc, argv);
  const comm::LaunchEnv env = comm::detect_launch_env();
  try {
    if (*launch) return train::launch(lopts);
    if (*train) return run_train_command(train_opts);
    if (*plan) return cli::run_plan_command(plan_opts);
    if (*metrics) return cli::run_metrics_command(metrics_opts);
    if (*gen) return cmd_generate(ckpt_dir, prompt, tok_path, max_new, temperature, top_k, seed);
    if (*ev) return cmd_eval(ckpt_dir, tokens, eval_batch);
    if (*prep) return cmd_prepare(popts);
    if (*exp) {
      const int64_t n = ckpt::export_hf(ckpt_dir, export_out);
      std::cout << "wrote " << n << " tensors to " << export_out << "/model.safetensors\n";
      return 0;
    }
    if (*memory) return cli::run_memory_command(memory_opts);
    if (*report) return cli::run_report_command(report_opts);
  } catch (const std::exception& e) {  // moetron::Error and the standard library's
    const std::string who = env.under_mpi ? "rank " + std::to_string(env.rank) + ": " : "";
    std::cerr << who << "error: " << e.what() << std::endl;
    if (env.under_mpi) train::write_rank_error(env.rank, who + "error: " + e.what());
    comm::abort_world(1);
    return 1;
  }
  return 0;
}
