// parallel.auto = true: the planner (planner/layout_search.h) chooses the
// layout of a job from its world size and a hardware profile (this
// machine's, written by `moetron calibrate`, by default), and the trainer
// runs what it chose.
//
// The search covers tp, cp, pp (with vpp 1 or 2), ep, micro-batch (1-16
// sequences), recompute (none, selective, full) and ZeRO-1 on one node of
// world-size devices; the plans are taken fastest first, and the first one
// the trainer accepts (the config's own rules, then the TrainingPlan) wins.
// Every rank computes the same choice (the search is deterministic).
#pragma once

#include <string>

#include "moetron/planner/layout_search.h"
#include "moetron/train/config.h"

namespace moetron::train {

struct AutoLayout {
  Config config;               // with the chosen layout written into it
  planner::RankedPlan chosen;  // the planner's prediction for it
  int64_t considered = 0;      // plans tried before one was accepted (1: the fastest)
  int64_t fit = 0;             // layouts of the search that fit the profile's memory
  std::string profile;         // the hardware profile's file
  // One line for the log: the layout, its predicted step and why.
  std::string summary() const;
};

// What the cost model needs of a config: the model, routing, sequence and
// global batch (train.global_batch, else micro_batch x grad_accum).
planner::Workload planner_workload(const Config& cfg);

// `cfg` with its layout chosen for `world_size` ranks. Throws naming
// parallel.auto when no layout of the search both fits and is accepted.
AutoLayout choose_auto_layout(const Config& cfg, int world_size);

// `cfg` itself when parallel.auto is off; else the chosen layout's config,
// with its summary written to `log` (when given).
Config resolve_auto_layout(const Config& cfg, int world_size, std::string* log);

}  // namespace moetron::train
