// Reinforcement-learning layout search: a policy over the layout decisions
// (tp, cp, pp, ep, vpp, micro-batch, recompute, ZeRO stage, offload; dp is what the
// others leave of the cluster) trained with REINFORCE against the cost
// model, for spaces too large to enumerate.
//
// The policy is one softmax per decision over that decision's values,
// sampled in order with the values that cannot divide what is left of the
// cluster masked out (so every sample is a cluster-covering layout; the
// log-probability is the masked softmax's). The reward of a layout that
// fits is -log(step / ideal step) (ideal: the model's FLOPs at every
// device's peak), so rewards are scale-free; a layout over the memory budget
// is pushed below every fitting one by 1 + 2 log(memory / budget), one the
// workload rejects (heads by tp, experts by ep, ...) gets a fixed floor.
// Each batch's advantages are normalised (batch mean as baseline) and the
// logits take a plain gradient step. Every distinct layout is evaluated
// once (memoised); the search stops when a number of batches in a row
// brings no new layout (the policy has converged) or the sample budget is
// spent. A local search from the best sample (every layout one or two
// decisions away) then catches what independent decisions miss where two
// interact; the result says what the policy alone found.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/planner/layout_search.h"

namespace moetron::planner {

struct RlOptions {
  int64_t max_samples = 20000;  // layouts sampled (repeats included)
  int64_t max_evaluations = 0;  // distinct layouts evaluated; 0: no limit
  int64_t batch = 64;           // samples per policy update
  double learning_rate = 0.15;
  int64_t patience = 8;  // batches in a row without a new layout before stopping
  uint64_t seed = 1;
  bool polish = true;  // local search from the policy's best (see the .cpp)
};

struct RlResult {
  RankedPlan best;          // the fastest fitting layout evaluated
  bool found = false;       // false: nothing sampled fit
  int64_t samples = 0;      // layouts drawn from the policy
  int64_t evaluations = 0;  // distinct layouts the cost model was asked about
  int64_t updates = 0;      // policy gradient steps
  double seconds = 0;
  // Before the local-search polish: the policy's own best and the
  // evaluations it took.
  double policy_step_s = 0;
  int64_t policy_evaluations = 0;
  // The best step time found after each update (how the search converged).
  std::vector<double> best_by_update;
};

RlResult rl_search_layouts(const CostModel& model, int64_t devices, const SearchSpace& space = {},
                           const RlOptions& options = {});

}  // namespace moetron::planner
