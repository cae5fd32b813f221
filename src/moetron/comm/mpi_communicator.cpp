#include "moetron/comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "moetron/comm/wait_hook.h"
#include "moetron/core/allocator.h"
#include "moetron/core/error.h"

namespace moetron::comm {

namespace {

using clock_type = std::chrono::steady_clock;

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    MOETRON_FAIL("MPI ", what, " failed: ", std::string(msg, static_cast<size_t>(len)));
  }
}

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  // OpenMPI 4.1's non-blocking reductions (coll/libnbc) malloc full-size
  // temporaries on every call (Ireduce_scatter_block the whole buffer, on
  // rank 0): kept in the heap, their pages are reused, not faulted in anew.
  keep_freed_memory_in_heap();
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;  // moved as raw bits; reduced staged through f32
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::max ? MPI_MAX : MPI_SUM;
}

// MPI_Waitall, or with a wait hook installed (comm/wait_hook.h) an
// MPI_Testall loop that calls it between polls. OpenMPI's MPI_Waitall spins
// on its progress engine the same way, so the loop costs no latency
// (bench/RESULTS.md, "Heartbeats while waiting").
void wait_all(std::vector<MPI_Request>& requests, const char* what) {
  const int n = static_cast<int>(requests.size());
  const WaitHook hook = wait_hook();
  if (hook == nullptr) {
    check_mpi(MPI_Waitall(n, requests.data(), MPI_STATUSES_IGNORE), what);
    return;
  }
  for (int done = 0;;) {
    check_mpi(MPI_Testall(n, requests.data(), &done, MPI_STATUSES_IGNORE), what);
    if (done) return;
    hook();
  }
}

class MpiWork;

// The operations of one communicator still in flight, so poll() can test
// them; shared with the Work handles, so either may outlive the other.
struct PendingWorks {
  std::vector<MpiWork*> works;
  void remove(MpiWork* w) {
    for (auto& p : works) {
      if (p == w) {
        p = works.back();
        works.pop_back();
        return;
      }
    }
  }
};

// Requests plus what runs when they complete (fp32 -> bf16 rounding, the
// division of an average), and the stats entry the time goes to.
class MpiWork final : public Work {
 public:
  MpiWork(CommStats& stats, std::shared_ptr<PendingWorks> pending, std::function<void()> on_done)
      : stats_(stats),
        pending_(std::move(pending)),
        on_done_(std::move(on_done)),
        start_(clock_type::now()) {
    pending_->works.push_back(this);
  }
  ~MpiWork() override {
    try {
      wait();
    } catch (...) {
    }
    if (!done_) pending_->remove(this);
  }
  // Filled by the communicator right after construction; MPI_REQUEST_NULL
  // until an MPI_I* call succeeds, so a failed post leaves nothing to wait on.
  MPI_Request& add_request() { return requests_.emplace_back(MPI_REQUEST_NULL); }
  void wait() override {
    if (done_) return;
    const auto blocked_from = clock_type::now();
    if (!requests_.empty()) wait_all(requests_, "wait");
    stats_.blocked_seconds +=
        std::chrono::duration<double>(clock_type::now() - blocked_from).count();
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 1;
    if (!requests_.empty()) {
      check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                            MPI_STATUSES_IGNORE),
                "test");
    }
    if (flag) finish();
    return done_;
  }
  std::vector<Tensor> keep_alive;  // staging buffers the requests point into

 private:
  void finish() {
    done_ = true;
    pending_->remove(this);
    if (on_done_) on_done_();
    stats_.seconds += std::chrono::duration<double>(clock_type::now() - start_).count();
  }
  std::vector<MPI_Request> requests_;
  CommStats& stats_;
  std::shared_ptr<PendingWorks> pending_;
  std::function<void()> on_done_;
  clock_type::time_point start_;
  bool done_ = false;
};

// bf16 and f16 are reduced in fp32 (MPI has no 16-bit float type): widened
// exactly, summed, rounded to nearest even once.
bool staged_through_f32(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

Tensor to_f32(const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::f32, MemTag::comm);
  const auto* s = static_cast<const uint16_t*>(t.raw());
  float* d = f.data<float>();
  if (t.dtype() == DType::bf16) {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = bf16_to_f32(s[i]);
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = f16_to_f32(s[i]);
  }
  return f;
}

void from_f32(const Tensor& f, const Tensor& t) {
  auto* d = static_cast<uint16_t*>(t.raw());
  const float* s = f.data<float>();
  if (t.dtype() == DType::bf16) {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = f32_to_bf16(s[i]);
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = f32_to_f16(s[i]);
  }
}

void divide(const Tensor& t, int n) {
  const int64_t c = t.numel();
  switch (t.dtype()) {
    case DType::f32:
      for (int64_t i = 0; i < c; ++i) t.data<float>()[i] /= static_cast<float>(n);
      break;
    case DType::f64:
      for (int64_t i = 0; i < c; ++i) t.data<double>()[i] /= n;
      break;
    case DType::i32:
      for (int64_t i = 0; i < c; ++i) t.data<int32_t>()[i] /= n;
      break;
    case DType::i64:
      for (int64_t i = 0; i < c; ++i) t.data<int64_t>()[i] /= n;
      break;
    default:
      MOETRON_FAIL("average of ", t.str(), " is not supported");
  }
}

int count_of(const Tensor& t) {
  MOETRON_CHECK(t.numel() <= INT32_MAX, "MPI buffer ", t.str(), " exceeds 2^31 elements");
  return static_cast<int>(t.numel());
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  // Out of place, from a copy in a comm-tagged send buffer (the allocator
  // reuses its block from call to call): OpenMPI 4.1's in-place
  // MPI_Iallreduce allocates and first-touches a full-size temporary inside
  // every call, ~8x slower at 64 MiB here (bench/RESULTS.md, "Progress").
  std::unique_ptr<Work> allreduce_async(const Tensor& buf, ReduceOp op) override {
    CommStats& st = begin("allreduce", 2 * ring_share(buf.nbytes()));
    const bool stage = staged_through_f32(buf.dtype());
    Tensor send = stage ? to_f32(buf) : Tensor::empty(buf.shape(), buf.dtype(), MemTag::comm);
    if (!stage && buf.nbytes()) std::memcpy(send.raw(), buf.raw(), buf.nbytes());
    Tensor recv = stage ? Tensor::empty(buf.shape(), DType::f32, MemTag::comm) : buf;
    const int n = size_;
    auto w = make_work(st, [recv, buf, stage, op, n] {
      if (op == ReduceOp::avg) divide(recv, n);
      if (stage) from_f32(recv, buf);
    });
    w->keep_alive = {send, recv};
    check_mpi(MPI_Iallreduce(send.raw(), recv.raw(), count_of(recv), mpi_type(recv.dtype()),
                             mpi_op(op), comm_, &w->add_request()),
              "allreduce");
    return w;
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& src, const Tensor& dst,
                                             ReduceOp op) override {
    MOETRON_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel() * size_,
                  "reduce_scatter: src ", src.str(), " must be ", size_, " chunks of dst ",
                  dst.str());
    CommStats& st = begin("reduce_scatter", ring_share(src.nbytes()));
    const bool stage = staged_through_f32(src.dtype());
    Tensor s = stage ? to_f32(src) : src;
    Tensor d = stage ? Tensor::empty(dst.shape(), DType::f32, MemTag::comm) : dst;
    const int n = size_;
    auto w = make_work(st, [d, dst, stage, op, n] {
      if (op == ReduceOp::avg) divide(d, n);
      if (stage) from_f32(d, dst);
    });
    w->keep_alive = {s, d};
    check_mpi(MPI_Ireduce_scatter_block(s.raw(), d.raw(), count_of(d), mpi_type(d.dtype()),
                                        mpi_op(op), comm_, &w->add_request()),
              "reduce_scatter");
    return w;
  }

  std::unique_ptr<Work> allgather_async(const Tensor& src, const Tensor& dst) override {
    MOETRON_CHECK(src.dtype() == dst.dtype() && dst.numel() == src.numel() * size_,
                  "allgather: dst ", dst.str(), " must be ", size_, " chunks of src ", src.str());
    CommStats& st = begin("allgather", ring_share(dst.nbytes()));
    auto w = make_work(st, nullptr);
    check_mpi(MPI_Iallgather(src.raw(), count_of(src), mpi_type(src.dtype()), dst.raw(),
                             count_of(src), mpi_type(dst.dtype()), comm_, &w->add_request()),
              "allgather");
    return w;
  }

  std::unique_ptr<Work> alltoall_async(const Tensor& src, const Tensor& dst) override {
    MOETRON_CHECK(
        src.dtype() == dst.dtype() && src.numel() == dst.numel() && src.numel() % size_ == 0,
        "alltoall: ", src.str(), " and ", dst.str(), " must be ", size_, " equal chunks");
    CommStats& st = begin("alltoall", ring_share(src.nbytes()));
    auto w = make_work(st, nullptr);
    const int chunk = count_of(src) / size_;
    check_mpi(MPI_Ialltoall(src.raw(), chunk, mpi_type(src.dtype()), dst.raw(), chunk,
                            mpi_type(dst.dtype()), comm_, &w->add_request()),
              "alltoall");
    return w;
  }

  std::unique_ptr<Work> alltoallv_async(const Tensor& src, const std::vector<int64_t>& send_rows,
                                        const Tensor& dst,
                                        const std::vector<int64_t>& recv_rows) override {
    MOETRON_CHECK(
        static_cast<int>(send_rows.size()) == size_ && static_cast<int>(recv_rows.size()) == size_,
        "alltoallv needs ", size_, " send and receive counts");
    MOETRON_CHECK(src.dtype() == dst.dtype() && src.rank() >= 1 && dst.rank() >= 1,
                  "alltoallv: ", src.str(), " -> ", dst.str());
    const int64_t row =
        src.dim(0) ? src.numel() / src.dim(0) : (dst.dim(0) ? dst.numel() / dst.dim(0) : 0);
    auto w = make_work(begin("alltoallv", 0), nullptr);
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    int64_t so = 0, ro = 0, sent = 0;
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      sc[i] = static_cast<int>(send_rows[i] * row);
      sd[i] = static_cast<int>(so);
      rc[i] = static_cast<int>(recv_rows[i] * row);
      rd[i] = static_cast<int>(ro);
      so += sc[i];
      ro += rc[i];
      if (r != rank_) sent += sc[i];
    }
    MOETRON_CHECK(so <= src.numel() && ro <= dst.numel(), "alltoallv: counts exceed ", src.str(),
                  " or ", dst.str());
    stats_for("alltoallv").bytes_sent += sent * static_cast<int64_t>(src.element_size());
    check_mpi(MPI_Ialltoallv(src.raw(), sc.data(), sd.data(), mpi_type(src.dtype()), dst.raw(),
                             rc.data(), rd.data(), mpi_type(dst.dtype()), comm_, &w->add_request()),
              "alltoallv");
    return w;
  }

  std::unique_ptr<Work> broadcast_async(const Tensor& buf, int root) override {
    MOETRON_CHECK(root >= 0 && root < size_, "broadcast root ", root, " out of range for size ",
                  size_);
    auto w = make_work(begin("broadcast", rank_ == root ? static_cast<int64_t>(buf.nbytes()) : 0),
                       nullptr);
    check_mpi(
        MPI_Ibcast(buf.raw(), count_of(buf), mpi_type(buf.dtype()), root, comm_, &w->add_request()),
        "broadcast");
    return w;
  }

  std::unique_ptr<Work> send_async(const Tensor& buf, int peer, int tag) override {
    check_peer(peer, "send");
    auto w = make_work(begin("send", static_cast<int64_t>(buf.nbytes())), nullptr);
    check_mpi(MPI_Isend(buf.raw(), count_of(buf), mpi_type(buf.dtype()), peer, tag, comm_,
                        &w->add_request()),
              "send");
    return w;
  }

  std::unique_ptr<Work> recv_async(const Tensor& buf, int peer, int tag) override {
    check_peer(peer, "recv");
    auto w = make_work(begin("recv", 0), nullptr);
    check_mpi(MPI_Irecv(buf.raw(), count_of(buf), mpi_type(buf.dtype()), peer, tag, comm_,
                        &w->add_request()),
              "recv");
    return w;
  }

  void barrier() override {
    ++stats_for("barrier").calls;
    if (wait_hook() == nullptr) {
      check_mpi(MPI_Barrier(comm_), "barrier");
      return;
    }
    std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
    check_mpi(MPI_Ibarrier(comm_, request.data()), "barrier");
    wait_all(request, "barrier");
  }

  // Tests every operation still in flight: OpenMPI progresses non-blocking
  // collectives only inside MPI calls. A dedicated progress thread measured
  // worse on one core per rank (bench/RESULTS.md, "Progress").
  void poll() override {
    // test() of a finished operation removes it from the list: test a copy.
    const std::vector<MpiWork*> now = pending_->works;
    for (MpiWork* w : now) w->test();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "comm split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  // The (n-1)/n share of a buffer a ring algorithm moves per rank per pass.
  int64_t ring_share(size_t bytes) const {
    return static_cast<int64_t>(bytes) * (size_ - 1) / size_;
  }
  std::unique_ptr<MpiWork> make_work(CommStats& st, std::function<void()> on_done) {
    return std::make_unique<MpiWork>(st, pending_, std::move(on_done));
  }
  CommStats& begin(const char* op, int64_t bytes) {
    CommStats& s = stats_for(op);
    ++s.calls;
    s.bytes_sent += bytes;
    return s;
  }
  void check_peer(int peer, const char* op) const {
    MOETRON_CHECK(peer >= 0 && peer < size_ && peer != rank_, op, ": peer rank ", peer,
                  " invalid for rank ", rank_, " of ", size_);
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<PendingWorks> pending_ = std::make_shared<PendingWorks>();
};

}  // namespace

namespace {

// A non-negative integer from the environment, or -1 when unset or not one.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (*end == 0 && x >= 0 && x <= INT32_MAX) ? static_cast<int>(x) : -1;
}

}  // namespace

LaunchEnv detect_launch_env() {
  struct Vars {
    const char* rank;
    std::vector<const char*> sizes;  // the first one set
    const char* local_rank;
    const char* local_size;
  };
  const Vars launchers[] = {
      {"OMPI_COMM_WORLD_RANK",
       {"OMPI_COMM_WORLD_SIZE"},
       "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI_RANK", {"PMI_SIZE"}, "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      // A job step (srun), not the batch script: SLURM_PROCID is per task.
      {"SLURM_PROCID",
       {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"},
       "SLURM_LOCALID",
       "SLURM_STEP_TASKS_PER_NODE"},
      {"PMIX_RANK", {}, nullptr, nullptr},
  };
  for (const Vars& v : launchers) {
    const int rank = env_int(v.rank);
    if (rank < 0) continue;
    int size = v.sizes.empty() ? 0 : -1;
    for (const char* s : v.sizes) {
      if ((size = env_int(s)) >= 1) break;
    }
    if (!v.sizes.empty() && size < 1) continue;
    LaunchEnv e{true, rank, size, 0, 1};
    if (v.local_rank && env_int(v.local_rank) >= 0) e.local_rank = env_int(v.local_rank);
    // SLURM_STEP_TASKS_PER_NODE reads e.g. "4" or "4(x2),3": this node's is
    // approximated by the first count.
    if (v.local_size) {
      const char* ls = std::getenv(v.local_size);
      const int n = ls ? std::atoi(ls) : 0;
      if (n >= 1) e.local_size = n;
    }
    e.local_size = std::max(e.local_size, e.local_rank + 1);
    return e;
  }
  return {};
}

void abort_world(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1) return;
  // mpirun forwards a rank's output asynchronously and stops forwarding once
  // it kills the job: give it a moment to deliver the error just printed.
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Communicator> make_mpi_world() {
  ensure_mpi();
  MPI_Comm world;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "comm dup");
  return std::make_unique<MpiCommunicator>(world);
}

}  // namespace moetron::comm
