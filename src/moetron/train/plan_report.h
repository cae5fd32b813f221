// What a user sees before launching N ranks (`moetron plan`, `moetron train
// --dry-run`): the TrainingPlan for N ranks of a config, computed in one
// process without MPI and without allocating the model: each rank's
// coordinates, the groups on each axis, the stages and their layers, the
// reducers' buckets and ZeRO-1 chunks, and the memory model's prediction
// per rank (the same prediction each rank prints when the job starts).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "moetron/parallel/training_plan.h"
#include "moetron/train/config.h"

namespace moetron::train {

struct PlanReportOptions {
  int64_t threads = 1;           // OpenMP threads per rank (per-thread kernel scratch)
  bool memory = true;            // predict each rank's memory
  int64_t max_table_ranks = 64;  // the table lists at most this many ranks (the JSON all)
};

nlohmann::json plan_json(const Config& cfg, const parallel::TrainingPlan& plan,
                         const PlanReportOptions& o);
// The same as a table (from plan_json's object).
std::string plan_table(const nlohmann::json& plan, const PlanReportOptions& o);

}  // namespace moetron::train
