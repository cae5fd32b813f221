// Exhaustive layout search over a cost model (planner/cost_model.h): every
// dp x tp x pp x ep x cp of `devices` (tp within a node), interleaving,
// micro-batch size, recompute policy, ZeRO stage (none, 1, 3) and offload
// that fits the workload and the device's memory, ranked by predicted step
// time. ZeRO-3 and offload are planner-only (LayoutChoice::beyond_runtime).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moetron/planner/cost_model.h"

namespace moetron::planner {

struct RankedPlan {
  LayoutChoice layout;
  StepCost cost;
};

struct SearchResult {
  std::vector<RankedPlan> plans;  // fastest first, at most `top`
  int64_t evaluated = 0;          // layouts the cost model was asked about
  int64_t fit = 0;                // of them, those that fit the workload and memory
  double seconds = 0;             // the search's own time
  // The layout needing the least memory per device among those that fit
  // the workload (what "nothing fits" is short of).
  LayoutChoice leanest;
  double leanest_bytes = 0;
  // The fastest fitting layout with 1-D tp ([0]) and with 2-D tp ([1]), so a
  // plan can say why it chose one (valid when found[i]).
  RankedPlan best_by_tp_grid[2];
  bool found_by_tp_grid[2] = {false, false};
};

struct SearchSpace {
  std::vector<int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<int64_t> vpps = {1, 2, 4};
  std::vector<std::string> recompute = {"none", "selective", "full"};
  std::vector<int> zero = {0, 1, 3};          // ZeRO stages (3: planner-only)
  std::vector<bool> offload = {false, true};  // planner-only when true
  std::vector<bool> tp_2d = {false, true};    // tp = q x q (parallel.tp_2d)
  int64_t max_cp = 8;
  // Layouts outside this are not considered (empty: all are).
  std::function<bool(const LayoutChoice&)> allow;
};

// What moetron's trainer runs today (no ZeRO-3, offload or 2-D tp), with
// micro-batches of 1-16 and vpp 1 or 2: parallel.auto's space.
SearchSpace trainer_space();

// "ep=1,pp=1,cp=1": a filter keeping the layouts with those degrees (keys
// dp, tp, pp, ep, cp, vpp, mb; tp2d=0|1 for 1-D or 2-D tp); throws naming
// a bad item.
std::function<bool(const LayoutChoice&)> fixed_degrees(const std::string& text);

// The divisors of n, ascending.
std::vector<int64_t> divisors(int64_t n);

SearchResult search_layouts(const CostModel& model, int64_t devices, int64_t top,
                            const SearchSpace& space = {});

}  // namespace moetron::planner
