// `moetron simulate`: one step of a plan (the best the layout search finds,
// or --layout) as a per-stage timeline written as a Chrome trace / Perfetto
// JSON (planner/step_timeline.h), with the predicted totals printed.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "moetron/cli/plan_cmd.h"

namespace moetron::cli {

struct SimulateCommand {
  PlanCommand plan;  // --config/--model, --cluster, --device, --layout, ...
  std::string trace_path;
};

CLI::App* add_simulate_command(CLI::App& app, SimulateCommand& opts);
int run_simulate_command(const SimulateCommand& opts);

}  // namespace moetron::cli
