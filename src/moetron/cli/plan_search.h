// `moetron plan --cluster NODESxDEVICES`: the layout search (or one given
// layout) over the cost model, for clusters this machine cannot run.
#pragma once

#include "moetron/cli/plan_cmd.h"
#include "moetron/planner/cost_model.h"

namespace moetron::cli {

int run_plan_search(const PlanCommand& opts);

// The cost model of --config (or --model's file) on --cluster of --device,
// after printing what it models; shared with `moetron simulate`.
struct PlanModel {
  planner::CostModel model;
  int64_t devices = 0;
};
PlanModel plan_cost_model(const PlanCommand& opts);

}  // namespace moetron::cli
