// Names the ranks that hold a job back. Each interval every rank reports
// its busy time (its step minus the time it waited on others: a rank that
// waits is not the slow one); a rank busier than the median by more than
// `margin` (a fraction) for `intervals` intervals in a row is a straggler
// until an interval finds it back within the margin.
#pragma once

#include <cstdint>
#include <vector>

namespace moetron::monitor {

class StragglerDetector {
 public:
  StragglerDetector(double margin, int64_t intervals);
  struct Change {
    int rank = 0;
    bool straggling = false;  // true: newly named; false: recovered
    double ratio = 0;         // busy time / median
  };
  // One interval's busy seconds per rank; returns the ranks whose state changed.
  std::vector<Change> observe(const std::vector<double>& busy_s);
  bool is_straggler(int rank) const;
  double median() const { return median_; }

 private:
  double margin_;
  int64_t intervals_;
  std::vector<int64_t> slow_runs_;  // consecutive slow intervals per rank
  std::vector<bool> straggling_;
  double median_ = 0;
};

}  // namespace moetron::monitor
