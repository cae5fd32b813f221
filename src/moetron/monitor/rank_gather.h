// Per-rank numbers (step time, data wait, communication wait, ...) for rank
// 0, by a non-blocking all-gather on a communicator of its own: monitoring
// traffic is counted apart from training's, and a step never waits for it.
// The numbers of interval k arrive at interval k + 1.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "moetron/comm/communicator.h"

namespace moetron::monitor {

class RankGather {
 public:
  using Table = std::vector<std::vector<double>>;  // [rank][value]
  RankGather(std::unique_ptr<comm::Communicator> comm, int64_t values_per_rank);
  ~RankGather();
  // Starts gathering this rank's `values` (collective: every rank calls it
  // each interval) and returns the previous interval's table, if any.
  std::optional<Table> exchange(const std::vector<double>& values);
  // Completes the gather in flight, returning its table.
  std::optional<Table> finish();
  comm::Communicator& communicator() { return *comm_; }

 private:
  Table table() const;

  std::unique_ptr<comm::Communicator> comm_;
  int64_t width_;
  Tensor send_, recv_;
  std::unique_ptr<comm::Work> pending_;
};

}  // namespace moetron::monitor
