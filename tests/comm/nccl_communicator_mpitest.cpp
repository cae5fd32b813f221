// The NCCL backend against values computed from rank numbers, under
// `mpirun -np N` (N = 1, 2, 4 in CTest), bootstrapped over the MPI world.
// Built only with NCCL. NCCL needs one GPU per rank: with fewer devices than
// ranks (or none) every test is skipped with a message saying so; that is a
// skip, not a pass.
#include <gtest/gtest.h>

#include "util/mpi_test_main.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <numeric>

#include "moetron/comm/nccl_communicator.h"
#include "util/test_util.h"

namespace moetron::comm {
namespace {

// The NCCL world, or nullptr (and the reason) when this machine cannot run it.
Communicator* nccl_world(std::string* why) {
  static std::unique_ptr<Communicator> world;
  static std::string reason;
  static bool tried = false;
  if (!tried) {
    tried = true;
    Communicator& mpi = test::mpi_world();
    std::string err;
    const int devices = cuda_device_count(&err);
    const char* local_size_env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks_here = local_size_env ? std::atoi(local_size_env) : mpi.size();
    // Every rank must agree to skip, or the others would hang in NCCL init.
    Tensor has = Tensor::empty({1}, DType::i32);
    has.data<int32_t>()[0] = devices >= 1 && devices >= ranks_here ? 1 : 0;
    mpi.allreduce(has, ReduceOp::sum);
    if (has.data<int32_t>()[0] == mpi.size()) {
      world = make_nccl_communicator(mpi);
    } else {
      reason = "NCCL backend built but not exercised: " + std::to_string(mpi.size()) + " ranks, " +
               std::to_string(devices) + " CUDA devices visible on rank " +
               std::to_string(mpi.rank()) +
               (err.empty() ? std::string() : " (cudaGetDeviceCount: " + err + ")") +
               " (on some rank too few for one GPU per rank)";
    }
  }
  if (why) *why = reason;
  return world.get();
}

#define NCCL_WORLD_OR_SKIP(w)          \
  std::string why_;                    \
  Communicator* w = nccl_world(&why_); \
  if (w == nullptr) GTEST_SKIP() << why_

TEST(Nccl, AllreduceSumAvgMaxOnHostTensors) {
  NCCL_WORLD_OR_SKIP(w);
  const int r = w->rank(), n = w->size();
  EXPECT_EQ(w->backend(), "nccl");
  Tensor f = Tensor::empty({1000}, DType::f32);
  for (int i = 0; i < 1000; ++i) f.data<float>()[i] = static_cast<float>(r * 10 + i % 13);
  w->allreduce(f, ReduceOp::sum);
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(f.data<float>()[i], static_cast<float>(10 * n * (n - 1) / 2 + n * (i % 13)));
  Tensor l = Tensor::empty({3}, DType::i64);
  for (int i = 0; i < 3; ++i) l.data<int64_t>()[i] = (int64_t{1} << 40) * (r + 1) + i;
  w->allreduce(l, ReduceOp::max);
  EXPECT_EQ(l.data<int64_t>()[2], (int64_t{1} << 40) * n + 2);
  Tensor a = Tensor::empty({5}, DType::f32);
  a.fill(static_cast<double>(2 * r));
  w->allreduce(a, ReduceOp::avg);
  EXPECT_FLOAT_EQ(a.data<float>()[4], static_cast<float>(n - 1));
  // bf16 natively: small integers are exact in bf16 however NCCL orders the sum.
  Tensor b = Tensor::empty({33}, DType::bf16);
  b.fill(static_cast<double>(r + 1));
  w->allreduce(b, ReduceOp::sum);
  for (int i = 0; i < 33; ++i) {
    EXPECT_EQ(static_cast<const uint16_t*>(b.raw())[i],
              f32_to_bf16(static_cast<float>(n * (n + 1) / 2)));
  }
  const CommStats st = w->stats_for("allreduce");
  EXPECT_EQ(st.calls, 4);
  EXPECT_GE(st.seconds, 0.0);
}

TEST(Nccl, ReduceScatterAllgatherAlltoallAndAlltoallv) {
  NCCL_WORLD_OR_SKIP(w);
  const int r = w->rank(), n = w->size();
  Tensor src = Tensor::empty({n * 3}, DType::f32);
  for (int i = 0; i < n * 3; ++i) src.data<float>()[i] = static_cast<float>(i + r);
  Tensor mine = test::poisoned({3}, DType::f32);
  w->reduce_scatter(src, mine, ReduceOp::sum);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(mine.data<float>()[i], static_cast<float>(n * (r * 3 + i) + n * (n - 1) / 2));
  Tensor all = test::poisoned({n * 3}, DType::f32);
  w->allgather(mine, all);
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(all.data<float>()[q * 3 + 2], static_cast<float>(n * (q * 3 + 2) + n * (n - 1) / 2));
  Tensor s = Tensor::empty({n, 2}, DType::i32), d = test::poisoned({n, 2}, DType::i32);
  for (int q = 0; q < n; ++q) s.data<int32_t>()[2 * q] = s.data<int32_t>()[2 * q + 1] = 100 * r + q;
  w->alltoall(s, d);
  for (int q = 0; q < n; ++q) EXPECT_EQ(d.data<int32_t>()[2 * q + 1], 100 * q + r);
  // Rank r sends (r + q) % 3 rows of width 4 to rank q, filled with 1000 r + q.
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    send[static_cast<size_t>(q)] = (r + q) % 3;
    recv[static_cast<size_t>(q)] = (q + r) % 3;
  }
  const int64_t ns = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t nr = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  Tensor vs = Tensor::empty({std::max<int64_t>(ns, 1), 4}, DType::f32);
  Tensor vd = test::poisoned({std::max<int64_t>(nr, 1), 4}, DType::f32);
  int64_t row = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < send[static_cast<size_t>(q)]; ++k, ++row)
      for (int c = 0; c < 4; ++c) vs.data<float>()[row * 4 + c] = static_cast<float>(1000 * r + q);
  w->alltoallv_async(vs, send, vd, recv)->wait();
  row = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < recv[static_cast<size_t>(q)]; ++k, ++row)
      EXPECT_EQ(vd.data<float>()[row * 4 + 3], static_cast<float>(1000 * q + r));
}

TEST(Nccl, BroadcastRingOfSendRecvPostedReceiveFirstAndSplit) {
  NCCL_WORLD_OR_SKIP(w);
  const int r = w->rank(), n = w->size();
  Tensor b = Tensor::empty({4}, DType::i64);
  b.fill(r == n - 1 ? 42.0 : -1.0);
  w->broadcast(b, n - 1);
  EXPECT_EQ(b.data<int64_t>()[3], 42);
  if (n > 1) {
    // Receive posted before send on every rank: deadlocks unless both are
    // issued together (the backend groups queued point-to-point operations).
    Tensor out = Tensor::empty({3}, DType::f32), in = test::poisoned({3}, DType::f32);
    out.fill(static_cast<double>(r));
    auto rx = w->recv_async(in, (r + n - 1) % n, 7);
    auto tx = w->send_async(out, (r + 1) % n, 7);
    tx->wait();
    rx->wait();
    EXPECT_EQ(in.data<float>()[0], static_cast<float>((r + n - 1) % n));
  }
  w->barrier();
  auto sub = w->split(r % 2, r);
  EXPECT_EQ(sub->size(), (n + 1 - r % 2) / 2);
  Tensor one = Tensor::empty({1}, DType::i32);
  one.data<int32_t>()[0] = 1;
  sub->allreduce(one, ReduceOp::sum);
  EXPECT_EQ(one.data<int32_t>()[0], sub->size());
}

TEST(Nccl, DeviceTensorsGoToNcclDirectly) {
  NCCL_WORLD_OR_SKIP(w);
  const int r = w->rank(), n = w->size();
  std::vector<float> host(256, static_cast<float>(r + 1));
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  Tensor t = Tensor::wrap(dev, {256}, DType::f32, Device::cuda);
  auto work = w->allreduce_async(t, ReduceOp::sum);
  while (!work->test()) {
  }
  ASSERT_EQ(cudaMemcpy(host.data(), dev, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(dev);
  for (float v : host) ASSERT_EQ(v, static_cast<float>(n * (n + 1) / 2));
}

}  // namespace
}  // namespace moetron::comm
