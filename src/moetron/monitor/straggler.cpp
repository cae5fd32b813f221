#include "moetron/monitor/straggler.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::monitor {

StragglerDetector::StragglerDetector(double margin, int64_t intervals)
    : margin_(margin), intervals_(intervals) {
  MOETRON_CHECK(margin > 0, "straggler margin must be positive, got ", margin);
  MOETRON_CHECK(intervals >= 1, "straggler intervals must be >= 1, got ", intervals);
}

std::vector<StragglerDetector::Change> StragglerDetector::observe(
    const std::vector<double>& busy_s) {
  const size_t n = busy_s.size();
  if (slow_runs_.size() != n) {
    slow_runs_.assign(n, 0);
    straggling_.assign(n, false);
  }
  std::vector<Change> changes;
  if (n < 2) return changes;  // one rank is never slower than itself
  std::vector<double> sorted = busy_s;
  std::sort(sorted.begin(), sorted.end());
  // The lower median: with two ranks, the faster one is the reference.
  median_ = sorted[(n - 1) / 2];
  for (size_t r = 0; r < n; ++r) {
    const double ratio = median_ > 0 ? busy_s[r] / median_ : 1.0;
    const bool slow = ratio > 1.0 + margin_;
    slow_runs_[r] = slow ? slow_runs_[r] + 1 : 0;
    const bool now = slow_runs_[r] >= intervals_ || (straggling_[r] && slow);
    if (now != straggling_[r]) {
      straggling_[r] = now;
      changes.push_back({static_cast<int>(r), now, ratio});
    }
  }
  return changes;
}

bool StragglerDetector::is_straggler(int rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < straggling_.size() &&
         straggling_[static_cast<size_t>(rank)];
}

}  // namespace moetron::monitor
