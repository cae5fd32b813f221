// `moetron plan --cluster NODESxDEVICES`: the layout search (or one given
// layout) over the cost model, for clusters this machine cannot run.
#pragma once

#include <string>

#include "moetron/cli/plan_cmd.h"
#include "moetron/planner/cost_model.h"

namespace moetron::cli {

int run_plan_search(const PlanCommand& opts);

// configs/<dir>/<name>.toml beside the working directory or the binary's
// checkout (how --device and --model name their files); throws naming what
// was looked for.
std::string find_configs_file(const std::string& dir, const std::string& name,
                              const std::string& option);

}  // namespace moetron::cli
