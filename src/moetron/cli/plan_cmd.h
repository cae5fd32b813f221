// `moetron plan` (and `moetron train --dry-run`): the TrainingPlan of a
// config on N ranks, from one process, as a table and as JSON
// (train/plan_report.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace moetron::cli {

struct PlanCommand {
  std::string config;
  std::string model;  // a preset: configs/scale/<model>.toml (instead of --config)
  std::vector<std::string> sets;
  int64_t ranks = 1;
  std::string json_path;  // "-": JSON on stdout instead of the table
  int64_t threads = 0;    // 0: train.threads, else this machine's OpenMP default
  bool no_memory = false;
  // Search mode (planner/layout_search.h), when --cluster is given.
  std::string cluster;          // "NODESxDEVICES", e.g. 128x8
  std::string device = "h200";  // configs/hardware/<device>.toml
  int64_t top = 10;
  int64_t global_batch = 0;  // sequences per step; 0: the config's
  int64_t seq_len = 0;       // 0: the config's
  std::string layout;        // "tp=8,pp=8,dp=16,...": evaluate this one instead of searching
  double routing_skew = 0.1;
  std::string search = "exhaustive";  // exhaustive | rl | both (rl, with its gap to exhaustive)
  int64_t rl_samples = 20000;         // the rl search's sample budget
  uint64_t seed = 1;                  // the rl search's
  std::string fix;                    // "ep=1,pp=1": search only layouts with these degrees
  bool no_dp_overlap = false;         // the dp reduction after the pipeline, not under it
  bool muon = false;                  // also compare Muon's update, replicated vs owner
};

CLI::App* add_plan_command(CLI::App& app, PlanCommand& opts);
int run_plan_command(const PlanCommand& opts);

}  // namespace moetron::cli
