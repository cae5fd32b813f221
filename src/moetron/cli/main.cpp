// moetron: train / eval / generate / prepare-data / plan / simulate / memory / metrics / launch /
// export / report. Library code throws moetron::Error; this is the one place that turns an error
// into a message and a non-zero exit: the sentence for users, and with --verbose (or in a debug
// build) the failed expression and its [file:line]. Started by mpirun or srun, a rank prefixes its
// errors with "rank R: " and aborts every rank of the job, so one failing rank never leaves the
// others waiting in a collective.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/ckpt/export.h"
#include "moetron/cli/calibrate_cmd.h"
#include "moetron/cli/eval_cmd.h"
#include "moetron/cli/generate_cmd.h"
#include "moetron/cli/memory_cmd.h"
#include "moetron/cli/metrics_cmd.h"
#include "moetron/cli/plan_cmd.h"
#include "moetron/cli/prepare_cmd.h"
#include "moetron/cli/report_cmd.h"
#include "moetron/cli/simulate_cmd.h"
#include "moetron/cli/train_cmd.h"
#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/train/launcher.h"

namespace {

using namespace moetron;

#ifdef NDEBUG
constexpr bool kDebugBuild = false;
#else
constexpr bool kDebugBuild = true;
#endif

CLI::App* add_launch_command(CLI::App& app, train::LaunchOptions& o) {
  auto* launch = app.add_subcommand(
      "launch", "run a moetron command on N ranks under mpirun (this machine, or --hostfile's)");
  launch->add_option("-n,--ranks", o.ranks, "number of ranks")->required();
  launch->add_option("--threads-per-rank", o.threads_per_rank,
                     "OpenMP threads per rank (0: cores / ranks)");
  launch->add_option("--hostfile", o.hostfile,
                     "OpenMP hostfile: run the ranks on these hosts (the run directory must be on "
                     "a filesystem they share)");
  launch->add_option("--silent-timeout", o.silent_timeout_s,
                     "seconds without a training step before a silent rank is named and the job "
                     "stopped (0: wait forever)");
  launch->add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                     "seconds a rank may send no heartbeat while the others do before it is "
                     "called hung and the attempt stopped (0: never)");
  launch->add_option("--max-restarts", o.max_restarts,
                     "relaunch a failed or hung job with --resume up to this many times (0: "
                     "report the failure and stop)");
  launch->add_option("--min-ranks", o.min_ranks,
                     "elastic: relaunch without the ranks listed in RUN/logs/unavailable while at "
                     "least this many remain, and grow again when RUN/logs/capacity allows (0: "
                     "fixed size)");
  launch
      ->add_option("command", o.command,
                   "after `--`: the moetron command, e.g. train --config C --out RUN")
      ->required();
  return launch;
}

struct ExportCommand {
  std::string checkpoint, out;
  ckpt::ExportOptions opts;
};

CLI::App* add_export_command(CLI::App& app, ExportCommand& o) {
  auto* exp = app.add_subcommand(
      "export", "write a checkpoint of any layout as one Hugging Face Mixtral directory");
  exp->add_option("--checkpoint", o.checkpoint, "checkpoint or run directory")->required();
  exp->add_option("--out", o.out, "output directory (must not exist)")->required();
  exp->add_flag("--tensors-only", o.opts.tensors_only,
                "any model (dense layers, shared experts, ...): the assembled tensors and "
                "moetron.toml, no Hugging Face architecture");
  return exp;
}

int run_export(const ExportCommand& o) {
  const int64_t n = ckpt::export_hf(ckpt::resolve_checkpoint_dir(o.checkpoint), o.out, o.opts);
  std::cout << "wrote " << n << " tensors to " << o.out << "/model.safetensors\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moetron: train Mixture-of-Experts transformers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moetron ") + MOETRON_VERSION);
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.fallthrough();                                // --verbose after the subcommand too
  bool verbose = kDebugBuild;
  app.add_flag("--verbose", verbose,
               "errors also name the failed check and its source location [file:line]");

  cli::TrainCommand train_opts;
  auto* train = cli::add_train_command(app, train_opts);
  cli::GenerateCommand gen_opts;
  auto* gen = cli::add_generate_command(app, gen_opts);
  cli::EvalCommand eval_opts;
  auto* ev = cli::add_eval_command(app, eval_opts);
  cli::PrepareCommand prep_opts;
  auto* prep = cli::add_prepare_command(app, prep_opts);
  cli::PlanCommand plan_opts;
  auto* plan = cli::add_plan_command(app, plan_opts);
  cli::SimulateCommand simulate_opts;
  auto* simulate = cli::add_simulate_command(app, simulate_opts);
  cli::MetricsCommand metrics_opts;
  auto* metrics = cli::add_metrics_command(app, metrics_opts);
  cli::MemoryCommand memory_opts;
  auto* memory = cli::add_memory_command(app, memory_opts);
  cli::CalibrateCommand calibrate_opts;
  auto* calibrate = cli::add_calibrate_command(app, calibrate_opts);
  cli::ReportCommand report_opts;
  auto* report = cli::add_report_command(app, report_opts);
  train::LaunchOptions lopts;
  auto* launch = add_launch_command(app, lopts);
  ExportCommand export_opts;
  auto* exp = add_export_command(app, export_opts);

  CLI11_PARSE(app, argc, argv);
  const comm::LaunchEnv env = comm::detect_launch_env();
  try {
    if (*launch) return train::launch(lopts);
    if (*train) return cli::run_train_command(train_opts);
    if (*plan) return cli::run_plan_command(plan_opts);
    if (*simulate) return cli::run_simulate_command(simulate_opts);
    if (*metrics) return cli::run_metrics_command(metrics_opts);
    if (*gen) return cli::run_generate_command(gen_opts);
    if (*ev) return cli::run_eval_command(eval_opts);
    if (*prep) return cli::run_prepare_command(prep_opts);
    if (*exp) return run_export(export_opts);
    if (*memory) return cli::run_memory_command(memory_opts);
    if (*calibrate) return cli::run_calibrate_command(calibrate_opts);
    if (*report) return cli::run_report_command(report_opts);
  } catch (const std::exception& e) {  // moetron::Error and the standard library's
    const std::string who = env.under_mpi ? "rank " + std::to_string(env.rank) + ": " : "";
    std::string msg = who + "error: " + e.what();
    const auto* me = dynamic_cast<const Error*>(&e);
    if (verbose && me && !me->where().empty()) msg += " (" + me->where() + ")";
    std::cerr << msg << std::endl;
    if (env.under_mpi) train::write_rank_error(env.rank, msg);
    comm::abort_world(1);
    return 1;
  }
  return 0;
}
