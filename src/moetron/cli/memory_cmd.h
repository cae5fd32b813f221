// `moetron memory`: predicted per-rank peak bytes per allocator tag of a
// training config, for one or several recompute policies and the config's
// [parallel] layout at a given data-parallel size, without building the
// model (planner/memory_model.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace moetron::cli {

struct MemoryCommand {
  std::string config;
  std::vector<std::string> sets;
  std::string policies;  // comma-separated; "all": none, selective, full, sqrt; empty: the config's
  std::string json_path;  // "-": JSON on stdout instead of the table
  std::string budget;     // overrides train.memory_budget
  int64_t dp = 1;
  bool zero1 = false;
  int64_t stage = -1;   // pipeline stage to predict; -1: the stage with the largest peak
  int64_t threads = 0;  // 0: train.threads, else this machine's OpenMP default
};

CLI::App* add_memory_command(CLI::App& app, MemoryCommand& opts);
int run_memory_command(const MemoryCommand& opts);

}  // namespace moetron::cli
