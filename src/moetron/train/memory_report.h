// What a training config will hold in memory, per rank and per allocator
// tag, from the memory model (planner/memory_model.h): the trainer's report
// before the first step and `moetron memory`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moetron/core/allocator.h"
#include "moetron/parallel/training_plan.h"
#include "moetron/planner/memory_model.h"
#include "moetron/train/config.h"

namespace moetron::train {

// The memory model's inputs for rank `rank` of `plan` (the plan the job
// runs: its layout, precision, stage split) with `threads` OpenMP threads.
planner::MemoryInputs memory_inputs(const Config& cfg, const parallel::TrainingPlan& plan, int rank,
                                    int64_t threads);
// The same for `cfg` trained at `prec` on one rank of `layout`.
planner::MemoryInputs memory_inputs(const Config& cfg, const nn::Precision& prec, int64_t threads,
                                    const planner::Layout& layout = {});
// Rank `rank`'s place in `plan`.
planner::Layout layout_of(const parallel::TrainingPlan& plan, int rank);
// The layout of rank `rank` of a job of world_size ranks (pp outermost).
planner::Layout layout_of(const Config& cfg, int64_t world_size, int64_t rank);
// "dp 2, tp 2 (sp), ep 2, pp 2 1f1b stage 0" (no stage when l.stage < 0).
std::string describe(const planner::Layout& l);
// "bf16", "bf16 (bf16 grads, bf16 moments)": the compute dtype and the
// precision memory modes in use.
std::string describe_precision(const planner::MemoryInputs& in);
// train.memory_budget in bytes: "auto" is this rank's share of the machine's available
// memory now (divided by the ranks its launcher started on this machine).
int64_t memory_budget_bytes(const Config& cfg);

struct MemoryRow {
  std::string label;  // e.g. the recompute policy
  planner::MemoryEstimate estimate;
};

// One line per row: bytes per tag and the total peak, human-readable.
std::string memory_table(const std::vector<MemoryRow>& rows);
// {"label": ..., "bytes": {"params": n, ..., "total_peak": n}} per row.
nlohmann::json memory_json(const std::vector<MemoryRow>& rows);
// The report printed before the first step: predicted bytes per tag for this
// rank, the budget, and the largest micro-batch (at this seq_len, policy and
// precision) whose predicted peak fits it; a warning line when the
// configured micro-batch does not fit.
std::string memory_plan(const Config& cfg, const parallel::TrainingPlan& plan, int rank,
                        int64_t threads);
// The allocator's measured peaks in the same shape (for comparisons).
planner::MemoryEstimate measured_peaks(const MemStats& stats);

}  // namespace moetron::train
