#include "moetron/train/divergence_guard.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moetron/core/error.h"

namespace moetron::train {

double DivergenceGuard::recent_mean() const {
  if (losses_.empty()) return 0;
  return std::accumulate(losses_.begin(), losses_.end(), 0.0) / static_cast<double>(losses_.size());
}

bool DivergenceGuard::record(int64_t step, double loss, bool counts_as_skip) {
  consecutive_ = counts_as_skip ? consecutive_ + 1 : 0;
  skips_.push_back(counts_as_skip);
  if (static_cast<int64_t>(skips_.size()) > kWindow) skips_.pop_front();
  const auto skipped = std::count(skips_.begin(), skips_.end(), true);
  if (stop_.empty() && limits_.max_consecutive_skips > 0 &&
      consecutive_ >= limits_.max_consecutive_skips) {
    stop_ = str_cat("the run diverged: ", consecutive_,
                    " consecutive steps skipped for a non-finite loss or gradient, up to step ",
                    step, " (train.max_skipped_steps = ", limits_.max_consecutive_skips,
                    "); lower optim.lr or resume from an earlier checkpoint");
  }
  if (stop_.empty() && limits_.max_skipped_fraction > 0 &&
      static_cast<int64_t>(skips_.size()) == kWindow &&
      static_cast<double>(skipped) > limits_.max_skipped_fraction * static_cast<double>(kWindow)) {
    stop_ = str_cat("the run diverged: ", skipped, " of the last ", kWindow,
                    " steps were skipped for a non-finite loss or gradient, up to step ", step,
                    " (train.max_skipped_fraction = ", limits_.max_skipped_fraction,
                    "); lower optim.lr or resume from an earlier checkpoint");
  }
  if (!std::isfinite(loss)) return false;
  // A spike needs a recent range to compare with: a good step first. A
  // skipped step's finite loss is judged too (a diverged model's losses
  // explode before its gradients overflow).
  const bool spike = limits_.loss_spike_factor > 0 && !losses_.empty() &&
                     loss > limits_.loss_spike_factor * recent_mean();
  if (spike) {
    ++spikes_;
    return true;  // kept out of the recent range, so a run of spikes stays flagged
  }
  if (counts_as_skip) return false;
  losses_.push_back(loss);
  if (static_cast<int64_t>(losses_.size()) > kWindow) losses_.pop_front();
  return false;
}

}  // namespace moetron::train
