#include "moetron/monitor/rank_gather.h"

#include "moetron/core/error.h"

namespace moetron::monitor {

RankGather::RankGather(std::unique_ptr<comm::Communicator> comm, int64_t values_per_rank)
    : comm_(std::move(comm)), width_(values_per_rank) {
  MOETRON_CHECK(comm_ != nullptr, "RankGather needs a communicator");
  MOETRON_CHECK(width_ >= 1, "RankGather needs at least one value per rank");
}

RankGather::~RankGather() {
  try {
    finish();
  } catch (...) {  // a failed job is already being reported elsewhere
  }
}

RankGather::Table RankGather::table() const {
  Table t(static_cast<size_t>(comm_->size()));
  const double* v = recv_.data<double>();
  for (size_t r = 0; r < t.size(); ++r) {
    t[r].assign(v + static_cast<int64_t>(r) * width_, v + static_cast<int64_t>(r + 1) * width_);
  }
  return t;
}

std::optional<RankGather::Table> RankGather::finish() {
  if (!pending_) return std::nullopt;
  pending_->wait();
  pending_.reset();
  return table();
}

std::optional<RankGather::Table> RankGather::exchange(const std::vector<double>& values) {
  MOETRON_CHECK(static_cast<int64_t>(values.size()) == width_, "RankGather expects ", width_,
                " values per rank, got ", values.size());
  std::optional<Table> previous = finish();
  send_ = Tensor::empty({width_}, DType::f64, MemTag::comm);
  recv_ = Tensor::empty({comm_->size() * width_}, DType::f64, MemTag::comm);
  std::copy(values.begin(), values.end(), send_.data<double>());
  pending_ = comm_->allgather_async(send_, recv_);
  return previous;
}

}  // namespace moetron::monitor
