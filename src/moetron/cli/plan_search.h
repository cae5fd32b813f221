// `moetron plan --cluster NODESxDEVICES`: the layout search (or one given
// layout) over the cost model, for clusters this machine cannot run.
#pragma once

#include "moetron/cli/plan_cmd.h"
#include "moetron/planner/cost_model.h"

namespace moetron::cli {

int run_plan_search(const PlanCommand& opts);

}  // namespace moetron::cli
