// `moetron plan --cluster NODESxDEVICES`: the layout search (or one given
// layout) over the cost model, for clusters this machine cannot run.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "moetron/cli/plan_cmd.h"
#include "moetron/planner/cost_model.h"

namespace moetron::cli {

int run_plan_search(const PlanCommand& opts);
// Writes `j` to a temporary name and renames it into place: a failed write
// leaves no partial file.
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace moetron::cli
