#include "moetron/comm/communicator.h"

#include <cstring>

namespace moetron::comm {

CommStats& Communicator::stats_for(const std::string& op) {
  for (auto& [name, s] : stats_) {
    if (name == op) return s;
  }
  stats_.emplace_back(op, CommStats{});
  return stats_.back().second;
}

CommStats Communicator::total_stats() const {
  CommStats t;
  for (const auto& [name, s] : stats_) {
    t.calls += s.calls;
    t.bytes_sent += s.bytes_sent;
    t.seconds += s.seconds;
    t.blocked_seconds += s.blocked_seconds;
  }
  return t;
}

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

void copy_bytes(const Tensor& src, const Tensor& dst, const char* op) {
  MOETRON_CHECK(src.nbytes() == dst.nbytes() && src.dtype() == dst.dtype(), op, ": ", src.str(),
                " -> ", dst.str(), " differ in size or dtype");
  if (src.raw() != dst.raw() && src.nbytes()) std::memmove(dst.raw(), src.raw(), src.nbytes());
}

// size 1: every collective is the identity (a copy where src and dst differ).
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  std::unique_ptr<Work> allreduce_async(const Tensor&, ReduceOp) override {
    return done("allreduce");
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& src, const Tensor& dst,
                                             ReduceOp) override {
    copy_bytes(src, dst, "reduce_scatter");
    return done("reduce_scatter");
  }
  std::unique_ptr<Work> allgather_async(const Tensor& src, const Tensor& dst) override {
    copy_bytes(src, dst, "allgather");
    return done("allgather");
  }
  std::unique_ptr<Work> alltoall_async(const Tensor& src, const Tensor& dst) override {
    copy_bytes(src, dst, "alltoall");
    return done("alltoall");
  }
  std::unique_ptr<Work> alltoallv_async(const Tensor& src, const std::vector<int64_t>& send_rows,
                                        const Tensor& dst,
                                        const std::vector<int64_t>& recv_rows) override {
    MOETRON_CHECK(send_rows.size() == 1 && recv_rows.size() == 1 && send_rows[0] == recv_rows[0],
                  "alltoallv on one rank needs one equal count, got ", send_rows.size(), " and ",
                  recv_rows.size());
    copy_bytes(src.slice(0, send_rows[0]), dst.slice(0, recv_rows[0]), "alltoallv");
    return done("alltoallv");
  }
  std::unique_ptr<Work> broadcast_async(const Tensor&, int root) override {
    MOETRON_CHECK(root == 0, "broadcast root ", root, " out of range for a communicator of size 1");
    return done("broadcast");
  }
  std::unique_ptr<Work> send_async(const Tensor&, int peer, int) override {
    MOETRON_FAIL("send to rank ", peer, " on a communicator of size 1");
  }
  std::unique_ptr<Work> recv_async(const Tensor&, int peer, int) override {
    MOETRON_FAIL("recv from rank ", peer, " on a communicator of size 1");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return make_local_communicator(); }

 private:
  std::unique_ptr<Work> done(const char* op) {
    ++stats_for(op).calls;
    return std::make_unique<DoneWork>();
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

void broadcast_string(Communicator& comm, std::string& s, int root) {
  if (comm.size() == 1) return;
  int64_t len = static_cast<int64_t>(s.size());
  comm.broadcast(Tensor::wrap(&len, {1}, DType::i64), root);
  s.resize(static_cast<size_t>(len));
  if (len > 0) comm.broadcast(Tensor::wrap(s.data(), {len}, DType::u8), root);
}

}  // namespace moetron::comm
