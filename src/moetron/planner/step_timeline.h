// One training step of a plan as a timeline per pipeline stage, from the
// cost model's terms (planner/cost_model.h) laid out by an event
// simulation of the 1F1B schedule (parallel::simulate_schedule_timeline),
// and written as a Chrome trace (Perfetto and chrome://tracing open it).
//
// Each stage stands for its dp x tp x cp ranks (they run the same ops at
// the same times). Its forwards and backwards share what the cost model's
// pipelined terms add up to (compute, elementwise, exposed tp, ep, cp and
// pp traffic) evenly, a backward twice a forward, each op split into those
// parts in proportion; idle time before a stage's last op is bubble. The
// dp reduction ends where the cost model says its exposed part ends (the
// part it hides runs under the stage's last ops) and the optimizer follows
// both. The timeline's end is the cost
// model's step time by construction; the test checks it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moetron/planner/cost_model.h"

namespace moetron::planner {

struct TimelineSlice {
  int64_t stage = 0;
  int track = 0;                   // 0: the stage's ops (parts nested in them), 1: dp reduction
  std::string name;                // "F mb3 c0", "compute", "tp", "bubble", "dp reduction", ...
  std::string category;            // op | compute | comm | bubble | optimizer
  int depth = 0;                   // 1: a part of the op before it
  double start = 0, duration = 0;  // seconds from the step's start
};

struct StepTimeline {
  LayoutChoice layout;
  StepCost cost;
  int64_t microbatches = 0;  // per dp rank
  std::vector<TimelineSlice> slices;
  double end_s = 0;  // when the last stage's optimizer finishes
  // Seconds summed over stage 0's slices by name (compute, bubble, tp, ...).
  double total(const std::string& name, int64_t stage = 0) const;
};

StepTimeline simulate_step(const CostModel& model, const LayoutChoice& layout);

// The Chrome trace event format: complete events in microseconds, one
// process per stage, a thread for its ops and one for the dp reduction,
// the predicted totals under "otherData".
nlohmann::json chrome_trace(const StepTimeline& t, const std::string& title);

}  // namespace moetron::planner
