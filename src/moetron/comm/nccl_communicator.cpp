#include "moetron/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <functional>

#include "moetron/core/error.h"

namespace moetron::comm {

namespace {

using clock_type = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* what, int rank) {
  if (e != cudaSuccess) {
    MOETRON_FAIL("CUDA ", what, " failed on rank ", rank, ": ", cudaGetErrorString(e));
  }
}

void check_nccl(ncclResult_t r, const char* what, int rank, ncclComm_t comm = nullptr) {
  if (r != ncclSuccess) {
    const char* detail = comm ? ncclGetLastError(comm) : nullptr;
    MOETRON_FAIL("NCCL ", what, " failed on rank ", rank, ": ", ncclGetErrorString(r),
                 detail && *detail ? std::string(" (") + detail + ")" : std::string());
  }
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

int node_local_rank(int fallback) {
  for (const char* v :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}) {
    if (const char* s = std::getenv(v)) {
      char* end = nullptr;
      const long x = std::strtol(s, &end, 10);
      if (*s && *end == 0 && x >= 0) return static_cast<int>(x);
    }
  }
  return fallback;
}

// A send or receive waiting for the next flush (see NcclState::flush_p2p).
struct PendingP2p {
  bool is_send = false;
  Tensor buf;
  int peer = 0;
  std::shared_ptr<cudaEvent_t> done;  // recorded by the flush
};

std::shared_ptr<cudaEvent_t> make_event(int rank) {
  auto ev = std::shared_ptr<cudaEvent_t>(new cudaEvent_t{}, [](cudaEvent_t* e) {
    if (*e) cudaEventDestroy(*e);
    delete e;
  });
  check_cuda(cudaEventCreateWithFlags(ev.get(), cudaEventDisableTiming), "cudaEventCreate", rank);
  return ev;
}

// What a communicator and its Work handles share.
struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0, rank = 0, size = 1;
  std::vector<PendingP2p> p2p;

  void use_device() const { check_cuda(cudaSetDevice(device), "cudaSetDevice", rank); }
  void nccl(ncclResult_t r, const char* what) const { check_nccl(r, what, rank, comm); }
  void cuda(cudaError_t e, const char* what) const { check_cuda(e, what, rank); }

  // The device pointer NCCL reads or writes for `t`: t itself on a CUDA
  // device, else a stream-ordered staging allocation (filled from t when
  // `copy_in`), freed by release().
  void* device_ptr(const Tensor& t, bool copy_in) {
    if (t.device() == Device::cuda || t.nbytes() == 0) return t.raw();
    void* p = nullptr;
    cuda(cudaMallocAsync(&p, t.nbytes(), stream), "cudaMallocAsync (staging)");
    if (copy_in)
      cuda(cudaMemcpyAsync(p, t.raw(), t.nbytes(), cudaMemcpyHostToDevice, stream),
           "copy to device");
    return p;
  }
  // Copies a staged result back into host tensor t (when `copy_out`) and
  // frees the staging allocation, both in stream order.
  void release(const Tensor& t, void* p, bool copy_out) {
    if (p == t.raw()) return;
    if (copy_out)
      cuda(cudaMemcpyAsync(t.raw(), p, t.nbytes(), cudaMemcpyDeviceToHost, stream), "copy to host");
    cuda(cudaFreeAsync(p, stream), "cudaFreeAsync (staging)");
  }
  std::shared_ptr<cudaEvent_t> record() {
    auto ev = make_event(rank);
    cuda(cudaEventRecord(*ev, stream), "cudaEventRecord");
    return ev;
  }

  // NCCL send and receive block their stream until the peer's matching call:
  // a receive posted before a send on one stream would wait forever for a
  // peer doing the same. So point-to-point operations are queued and issued
  // together, in one ncclGroupStart/End, at the next wait/test/poll, the
  // next collective or barrier.
  void flush_p2p() {
    if (p2p.empty()) return;
    use_device();
    std::vector<void*> ptrs;
    for (const auto& op : p2p) ptrs.push_back(device_ptr(op.buf, op.is_send));
    nccl(ncclGroupStart(), "ncclGroupStart");
    for (size_t i = 0; i < p2p.size(); ++i) {
      const auto& op = p2p[i];
      const size_t n = static_cast<size_t>(op.buf.numel());
      if (op.is_send) {
        nccl(ncclSend(ptrs[i], n, nccl_type(op.buf.dtype()), op.peer, comm, stream), "ncclSend");
      } else {
        nccl(ncclRecv(ptrs[i], n, nccl_type(op.buf.dtype()), op.peer, comm, stream), "ncclRecv");
      }
    }
    nccl(ncclGroupEnd(), "ncclGroupEnd");
    for (size_t i = 0; i < p2p.size(); ++i) release(p2p[i].buf, ptrs[i], !p2p[i].is_send);
    for (const auto& op : p2p) cuda(cudaEventRecord(*op.done, stream), "cudaEventRecord");
    p2p.clear();
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, CommStats& stats, std::shared_ptr<cudaEvent_t> event)
      : state_(std::move(state)),
        stats_(stats),
        event_(std::move(event)),
        start_(clock_type::now()) {}
  ~NcclWork() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    const auto blocked_from = clock_type::now();
    state_->flush_p2p();
    state_->cuda(cudaEventSynchronize(*event_), "cudaEventSynchronize");
    stats_.blocked_seconds +=
        std::chrono::duration<double>(clock_type::now() - blocked_from).count();
    finish();
  }
  bool test() override {
    if (done_) return true;
    state_->flush_p2p();
    const cudaError_t e = cudaEventQuery(*event_);
    if (e == cudaErrorNotReady) return false;
    state_->cuda(e, "cudaEventQuery");
    finish();
    return true;
  }

 private:
  void finish() {
    done_ = true;
    stats_.seconds += std::chrono::duration<double>(clock_type::now() - start_).count();
  }
  std::shared_ptr<NcclState> state_;
  CommStats& stats_;
  std::shared_ptr<cudaEvent_t> event_;  // for p2p: recorded by the flush
  clock_type::time_point start_;
  bool done_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device) : s_(std::make_shared<NcclState>()) {
    s_->comm = comm;
    s_->device = device;
    check_nccl(ncclCommUserRank(comm, &s_->rank), "ncclCommUserRank", -1, comm);
    check_nccl(ncclCommCount(comm, &s_->size), "ncclCommCount", s_->rank, comm);
    s_->use_device();
    s_->cuda(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    try {
      s_->flush_p2p();
    } catch (...) {
    }
    cudaSetDevice(s_->device);
    cudaStreamSynchronize(s_->stream);
    ncclCommDestroy(s_->comm);
    cudaStreamDestroy(s_->stream);
  }
  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<Work> allreduce_async(const Tensor& buf, ReduceOp op) override {
    CommStats& st = begin("allreduce", 2 * ring_share(buf.nbytes()));
    void* p = s_->device_ptr(buf, true);
    s_->nccl(ncclAllReduce(p, p, static_cast<size_t>(buf.numel()), nccl_type(buf.dtype()),
                           nccl_op(op), s_->comm, s_->stream),
             "ncclAllReduce");
    s_->release(buf, p, true);
    return done(st);
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& src, const Tensor& dst,
                                             ReduceOp op) override {
    MOETRON_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel() * size(),
                  "reduce_scatter: src ", src.str(), " must be ", size(), " chunks of dst ",
                  dst.str());
    CommStats& st = begin("reduce_scatter", ring_share(src.nbytes()));
    void* s = s_->device_ptr(src, true);
    void* d = s_->device_ptr(dst, false);
    s_->nccl(ncclReduceScatter(s, d, static_cast<size_t>(dst.numel()), nccl_type(dst.dtype()),
                               nccl_op(op), s_->comm, s_->stream),
             "ncclReduceScatter");
    s_->release(src, s, false);
    s_->release(dst, d, true);
    return done(st);
  }

  std::unique_ptr<Work> allgather_async(const Tensor& src, const Tensor& dst) override {
    MOETRON_CHECK(src.dtype() == dst.dtype() && dst.numel() == src.numel() * size(),
                  "allgather: dst ", dst.str(), " must be ", size(), " chunks of src ", src.str());
    CommStats& st = begin("allgather", ring_share(dst.nbytes()));
    void* s = s_->device_ptr(src, true);
    void* d = s_->device_ptr(dst, false);
    s_->nccl(ncclAllGather(s, d, static_cast<size_t>(src.numel()), nccl_type(src.dtype()), s_->comm,
                           s_->stream),
             "ncclAllGather");
    s_->release(src, s, false);
    s_->release(dst, d, true);
    return done(st);
  }

  std::unique_ptr<Work> alltoall_async(const Tensor& src, const Tensor& dst) override {
    MOETRON_CHECK(
        src.dtype() == dst.dtype() && src.numel() == dst.numel() && src.numel() % size() == 0,
        "alltoall: ", src.str(), " and ", dst.str(), " must be ", size(), " equal chunks");
    CommStats& st = begin("alltoall", ring_share(src.nbytes()));
    const int64_t chunk = src.numel() / size();
    std::vector<int64_t> counts(static_cast<size_t>(size()), chunk);
    exchange(src, counts, dst, counts, 1);
    return done(st);
  }

  std::unique_ptr<Work> alltoallv_async(const Tensor& src, const std::vector<int64_t>& send_rows,
                                        const Tensor& dst,
                                        const std::vector<int64_t>& recv_rows) override {
    MOETRON_CHECK(static_cast<int>(send_rows.size()) == size() &&
                      static_cast<int>(recv_rows.size()) == size(),
                  "alltoallv needs ", size(), " send and receive counts");
    MOETRON_CHECK(src.dtype() == dst.dtype() && src.rank() >= 1 && dst.rank() >= 1,
                  "alltoallv: ", src.str(), " -> ", dst.str());
    const int64_t row =
        src.dim(0) ? src.numel() / src.dim(0) : (dst.dim(0) ? dst.numel() / dst.dim(0) : 0);
    int64_t so = 0, ro = 0, sent = 0;
    for (int r = 0; r < size(); ++r) {
      so += send_rows[static_cast<size_t>(r)] * row;
      ro += recv_rows[static_cast<size_t>(r)] * row;
      if (r != rank()) sent += send_rows[static_cast<size_t>(r)] * row;
    }
    MOETRON_CHECK(so <= src.numel() && ro <= dst.numel(), "alltoallv: counts exceed ", src.str(),
                  " or ", dst.str());
    CommStats& st = begin("alltoallv", sent * static_cast<int64_t>(src.element_size()));
    exchange(src, send_rows, dst, recv_rows, row);
    return done(st);
  }

  std::unique_ptr<Work> broadcast_async(const Tensor& buf, int root) override {
    MOETRON_CHECK(root >= 0 && root < size(), "broadcast root ", root, " out of range for size ",
                  size());
    CommStats& st = begin("broadcast", rank() == root ? static_cast<int64_t>(buf.nbytes()) : 0);
    void* p = s_->device_ptr(buf, rank() == root);
    s_->nccl(ncclBroadcast(p, p, static_cast<size_t>(buf.numel()), nccl_type(buf.dtype()), root,
                           s_->comm, s_->stream),
             "ncclBroadcast");
    s_->release(buf, p, true);
    return done(st);
  }

  std::unique_ptr<Work> send_async(const Tensor& buf, int peer,
                                   int /*tag: NCCL has none; order matches*/) override {
    check_peer(peer, "send");
    return queue_p2p(true, buf, peer, begin("send", static_cast<int64_t>(buf.nbytes()), false));
  }

  std::unique_ptr<Work> recv_async(const Tensor& buf, int peer, int) override {
    check_peer(peer, "recv");
    return queue_p2p(false, buf, peer, begin("recv", 0, false));
  }

  void barrier() override {
    ++stats_for("barrier").calls;
    s_->flush_p2p();
    s_->use_device();
    void* p = nullptr;
    s_->cuda(cudaMallocAsync(&p, sizeof(int32_t), s_->stream), "cudaMallocAsync (barrier)");
    s_->cuda(cudaMemsetAsync(p, 0, sizeof(int32_t), s_->stream), "cudaMemsetAsync (barrier)");
    s_->nccl(ncclAllReduce(p, p, 1, ncclInt32, ncclSum, s_->comm, s_->stream),
             "ncclAllReduce (barrier)");
    s_->cuda(cudaFreeAsync(p, s_->stream), "cudaFreeAsync (barrier)");
    s_->cuda(cudaStreamSynchronize(s_->stream), "cudaStreamSynchronize (barrier)");
  }

  void poll() override { s_->flush_p2p(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MOETRON_CHECK(color >= 0, "split: color must be >= 0, got ", color, " on rank ", rank());
    s_->flush_p2p();
    s_->use_device();
    ncclComm_t sub = nullptr;
    s_->nccl(ncclCommSplit(s_->comm, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_unique<NcclCommunicator>(sub, s_->device);
  }

 private:
  int64_t ring_share(size_t bytes) const {
    return static_cast<int64_t>(bytes) * (size() - 1) / size();
  }
  // Queued p2p operations go before a collective (every rank issues the same
  // sequence); a new send or receive joins the queue instead.
  CommStats& begin(const char* op, int64_t bytes, bool flush = true) {
    if (flush) s_->flush_p2p();
    s_->use_device();
    CommStats& st = stats_for(op);
    ++st.calls;
    st.bytes_sent += bytes;
    return st;
  }
  std::unique_ptr<Work> done(CommStats& st) {
    return std::make_unique<NcclWork>(s_, st, s_->record());
  }

  // Chunk r of src (send[r] rows of `row` elements) to rank r, chunk r of dst
  // from rank r: grouped ncclSend / ncclRecv.
  void exchange(const Tensor& src, const std::vector<int64_t>& send, const Tensor& dst,
                const std::vector<int64_t>& recv, int64_t row) {
    auto* s = static_cast<char*>(s_->device_ptr(src, true));
    auto* d = static_cast<char*>(s_->device_ptr(dst, false));
    const size_t es = src.element_size();
    const ncclDataType_t t = nccl_type(src.dtype());
    size_t so = 0, ro = 0;
    s_->nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r) {
      const auto sn = static_cast<size_t>(send[static_cast<size_t>(r)] * row);
      const auto rn = static_cast<size_t>(recv[static_cast<size_t>(r)] * row);
      if (sn)
        s_->nccl(ncclSend(s + so * es, sn, t, r, s_->comm, s_->stream), "ncclSend (alltoall)");
      if (rn)
        s_->nccl(ncclRecv(d + ro * es, rn, t, r, s_->comm, s_->stream), "ncclRecv (alltoall)");
      so += sn;
      ro += rn;
    }
    s_->nccl(ncclGroupEnd(), "ncclGroupEnd");
    s_->release(src, s, false);
    s_->release(dst, d, true);
  }

  std::unique_ptr<Work> queue_p2p(bool is_send, const Tensor& buf, int peer, CommStats& st) {
    auto ev = make_event(rank());  // recorded by flush_p2p
    s_->p2p.push_back({is_send, buf, peer, ev});
    return std::make_unique<NcclWork>(s_, st, ev);
  }
  void check_peer(int peer, const char* op) const {
    MOETRON_CHECK(peer >= 0 && peer < size() && peer != rank(), op, ": peer rank ", peer,
                  " invalid for rank ", rank(), " of ", size());
  }

  std::shared_ptr<NcclState> s_;
};

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  return n;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  const int rank = bootstrap.rank();
  std::string why;
  const int count = cuda_device_count(&why);
  MOETRON_CHECK(count > 0, "NCCL backend: no CUDA device on rank ", rank,
                why.empty() ? std::string() : " (cudaGetDeviceCount: " + why + ")");
  if (device < 0) device = node_local_rank(rank) % count;
  MOETRON_CHECK(device < count, "NCCL backend: device ", device, " requested on rank ", rank,
                " but only ", count, " visible");
  check_cuda(cudaSetDevice(device), "cudaSetDevice", rank);
  ncclUniqueId id{};
  if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", rank);
  bootstrap.broadcast(Tensor::wrap(&id, {static_cast<int64_t>(sizeof(id))}, DType::u8), 0);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, bootstrap.size(), id, rank), "ncclCommInitRank", rank);
  return std::make_unique<NcclCommunicator>(comm, device);
}

}  // namespace moetron::comm
