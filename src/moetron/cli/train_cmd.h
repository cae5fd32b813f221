// `moetron train`: its options, the dry run (= `moetron plan`), and the run
// itself under whatever started the process (alone, mpirun, srun).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace moetron::cli {

struct TrainCommand {
  std::string config, out;
  std::vector<std::string> sets;
  bool resume = false;
  bool allow_fresh_start = false;                // --resume over only damaged checkpoints
  std::vector<std::string> allow_config_change;  // model keys a resume may change
  bool dry_run = false;
  int64_t ranks = 1;  // planned by --dry-run
};

CLI::App* add_train_command(CLI::App& app, TrainCommand& opts);
int run_train_command(const TrainCommand& opts);

}  // namespace moetron::cli
