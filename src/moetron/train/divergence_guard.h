// When a run has diverged: the trainer skips a step whose loss or gradient
// is not finite (train.nan_policy = "skip"), which saves a run from one bad
// batch but not from a diverged model, whose steps are then nearly all
// skipped. The guard watches the steps and says when to stop
// (train.max_skipped_steps consecutive skips, or more than
// train.max_skipped_fraction of the last kWindow steps), and flags a finite
// loss that explodes above train.loss_spike_factor x the mean of the recent
// good steps. Pure bookkeeping: no I/O, the same on every rank (the losses
// it reads are already reduced over the ranks).
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace moetron::train {

struct DivergenceLimits {
  int64_t max_consecutive_skips = 10;  // 0: no limit
  double max_skipped_fraction = 0.5;   // of the last kWindow steps; 0: no limit
  double loss_spike_factor = 4.0;      // 0: no spike detection
};

class DivergenceGuard {
 public:
  static constexpr int64_t kWindow = 20;

  explicit DivergenceGuard(DivergenceLimits limits) : limits_(limits) {}

  // Records one step. `counts_as_skip`: skipped for a non-finite loss or
  // gradient (an fp16 overflow the loss scale can still absorb does not
  // count). Returns true when the step's finite loss (skipped or not) is a spike.
  bool record(int64_t step, double loss, bool counts_as_skip);

  // Empty while the run may go on; otherwise the sentence saying why it must stop.
  const std::string& stop_reason() const { return stop_; }
  // Skipped steps in a row up to the last one recorded.
  int64_t consecutive_skips() const { return consecutive_; }
  int64_t spikes() const { return spikes_; }
  // The mean loss of the recent good steps (0 before any).
  double recent_mean() const;

 private:
  DivergenceLimits limits_;
  int64_t consecutive_ = 0;
  std::deque<bool> skips_;     // the last kWindow steps
  std::deque<double> losses_;  // the last kWindow good steps' losses
  int64_t spikes_ = 0;
  std::string stop_;
};

}  // namespace moetron::train
