// Collective and point-to-point communication over a group of ranks, behind
// one interface: `local` (size 1), MPI (CPUs), later NCCL (GPUs). Every
// operation is also non-blocking, returning a Work handle; every operation
// records the bytes this rank sent and the wall time it took, per
// communicator (the cost model is checked against these).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::comm {

enum class ReduceOp { sum, avg, max };

// A pending operation. wait() blocks until done (and rethrows a failure);
// test() reports completion without blocking. Destroying a Work waits.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

struct CommStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;  // payload this rank put on the wire, by the algorithm's own count
  double seconds = 0;      // wall time from start to completion observed by wait()/test()
  // Wall time callers spent blocked inside wait() (a blocking call is a
  // start and a wait): what this rank lost waiting for others, unlike
  // `seconds`, which overlapped work also fills.
  double blocked_seconds = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // In place on `buf` (f32, bf16, f16, f64, i32, i64; bf16 and f16 are
  // reduced in fp32 and rounded once). avg divides by size().
  virtual std::unique_ptr<Work> allreduce_async(const Tensor& buf, ReduceOp op) = 0;
  // src: size() equal chunks along dim 0; dst: one chunk, the reduction of chunk rank().
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& src, const Tensor& dst,
                                                     ReduceOp op) = 0;
  // dst: size() chunks, chunk r = src of rank r.
  virtual std::unique_ptr<Work> allgather_async(const Tensor& src, const Tensor& dst) = 0;
  // src, dst: size() equal chunks; chunk r of src goes to rank r, chunk r of dst came from rank r.
  virtual std::unique_ptr<Work> alltoall_async(const Tensor& src, const Tensor& dst) = 0;
  // Counts and displacements in rows of dim 0 of src / dst.
  virtual std::unique_ptr<Work> alltoallv_async(const Tensor& src,
                                                const std::vector<int64_t>& send_rows,
                                                const Tensor& dst,
                                                const std::vector<int64_t>& recv_rows) = 0;
  virtual std::unique_ptr<Work> broadcast_async(const Tensor& buf, int root) = 0;
  virtual std::unique_ptr<Work> send_async(const Tensor& buf, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> recv_async(const Tensor& buf, int peer, int tag) = 0;
  virtual void barrier() = 0;
  // Lets outstanding non-blocking operations make progress. Compute loops call
  // it between kernels (the data-parallel reducer after every gradient it is
  // handed); a backend with its own progress engine makes it a no-op.
  virtual void poll() {}
  // Ranks with the same color form a new communicator, ordered by key.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  void allreduce(const Tensor& buf, ReduceOp op) { allreduce_async(buf, op)->wait(); }
  void reduce_scatter(const Tensor& src, const Tensor& dst, ReduceOp op) {
    reduce_scatter_async(src, dst, op)->wait();
  }
  void allgather(const Tensor& src, const Tensor& dst) { allgather_async(src, dst)->wait(); }
  void alltoall(const Tensor& src, const Tensor& dst) { alltoall_async(src, dst)->wait(); }
  void broadcast(const Tensor& buf, int root) { broadcast_async(buf, root)->wait(); }
  void send(const Tensor& buf, int peer, int tag = 0) { send_async(buf, peer, tag)->wait(); }
  void recv(const Tensor& buf, int peer, int tag = 0) { recv_async(buf, peer, tag)->wait(); }

  // Per operation name ("allreduce", ...). A deque: an entry stays where it
  // is when another is added, so a Work in flight can hold a reference to it.
  const std::deque<std::pair<std::string, CommStats>>& stats() const { return stats_; }
  CommStats& stats_for(const std::string& op);
  CommStats total_stats() const;

 private:
  std::deque<std::pair<std::string, CommStats>> stats_;
};

// Rank `root`'s string on every rank (its length, then its bytes).
void broadcast_string(Communicator& comm, std::string& s, int root = 0);

// A communicator of one rank: every collective is a local copy.
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace moetron::comm
