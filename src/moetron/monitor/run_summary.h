// The summary table at the top of a run report: steps, losses, medians of
// throughput and step time, skipped steps, checkpoints, restarts, wall time,
// and the layout and model where the run directory says them (the "start"
// event, else the latest checkpoint's manifest and moetron.toml).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moetron/monitor/run_history.h"

namespace moetron::monitor {

struct RunSummary {
  int64_t steps = 0;  // steps with a metrics line (after resumes)
  double first_step = NAN, last_step = NAN;
  double first_loss = NAN, last_loss = NAN, min_loss = NAN, min_loss_step = NAN;
  double last_val_loss = NAN, last_val_step = NAN;
  double median_tokens_per_s = NAN, median_mfu = NAN, median_step_s = NAN;
  int64_t skipped_steps = 0, checkpoints = 0, restarts = 0;
  bool checkpoints_from_disk = false;  // counted on disk (older ones may have been pruned)
  double wall_s = NAN;
  bool wall_from_step_times = false;  // no "time" in the lines: the sum of step times
  std::string layout, model;          // empty when unknown
  // The table's rows, label and value, in order.
  std::vector<std::pair<std::string, std::string>> rows;
};

RunSummary summarize(const RunHistory& h);

// The median of the finite values; NaN when there are none.
double median(std::vector<double> v);

}  // namespace moetron::monitor
