// Runs under `mpirun -np N` (N = 2 and 4 in CTest): every rank runs every
// test; expected values are computed from the rank numbers.
#include <gtest/gtest.h>

#include "util/mpi_test_main.h"

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/comm/wait_hook.h"
#include "util/test_util.h"

namespace moetron::comm {
namespace {

TEST(Mpi, AllreduceSumAvgMaxAcrossDtypes) {
  Communicator& w = test::mpi_world();
  const int r = w.rank(), n = w.size();
  Tensor f = Tensor::empty({7}, DType::f32);
  for (int i = 0; i < 7; ++i) f.data<float>()[i] = static_cast<float>(r * 10 + i);
  w.allreduce(f, ReduceOp::sum);
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ(f.data<float>()[i], static_cast<float>(10 * n * (n - 1) / 2 + n * i));
  Tensor l = Tensor::empty({3}, DType::i64);
  for (int i = 0; i < 3; ++i) l.data<int64_t>()[i] = (int64_t{1} << 40) * (r + 1) + i;
  w.allreduce(l, ReduceOp::max);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(l.data<int64_t>()[i], (int64_t{1} << 40) * n + i);
  Tensor a = Tensor::empty({5}, DType::f32);
  a.fill(static_cast<double>(2 * r));
  w.allreduce(a, ReduceOp::avg);
  EXPECT_FLOAT_EQ(a.data<float>()[4], static_cast<float>(n - 1));
  // bf16 is reduced in fp32 and rounded once: 1/3 summed n times is exact in
  // fp32 to ~1e-7 and then rounds to the bf16 nearest n/3.
  Tensor b = Tensor::empty({33}, DType::bf16);
  b.fill(1.0 / 3.0);
  w.allreduce(b, ReduceOp::sum);
  const float one_third_bf16 = bf16_to_f32(f32_to_bf16(1.0f / 3.0f));
  const uint16_t expect = f32_to_bf16(one_third_bf16 * static_cast<float>(n));
  for (int i = 0; i < 33; ++i) EXPECT_EQ(static_cast<const uint16_t*>(b.raw())[i], expect);
  // f16 likewise (the fp16 model's tp activations): summed in fp32, rounded once.
  Tensor h = Tensor::empty({33}, DType::f16);
  h.fill(1.0 / 3.0);
  w.allreduce(h, ReduceOp::sum);
  const float one_third_f16 = f16_to_f32(f32_to_f16(1.0f / 3.0f));
  const uint16_t expect_h = f32_to_f16(one_third_f16 * static_cast<float>(n));
  for (int i = 0; i < 33; ++i) EXPECT_EQ(static_cast<const uint16_t*>(h.raw())[i], expect_h);
  // Reduce-scatter of f16: chunk r sums to n * (r + 1) / 3, rounded once.
  Tensor hs = Tensor::empty({n * 5}, DType::f16), hmine = Tensor::empty({5}, DType::f16);
  for (int i = 0; i < n * 5; ++i) {
    static_cast<uint16_t*>(hs.raw())[i] = f32_to_f16(static_cast<float>(i / 5 + 1) / 3.0f);
  }
  w.reduce_scatter(hs, hmine, ReduceOp::sum);
  const uint16_t expect_rs =
      f32_to_f16(f16_to_f32(f32_to_f16(static_cast<float>(r + 1) / 3.0f)) * static_cast<float>(n));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(static_cast<const uint16_t*>(hmine.raw())[i], expect_rs);
}

TEST(Mpi, ReduceScatterAllgatherAlltoall) {
  Communicator& w = test::mpi_world();
  const int r = w.rank(), n = w.size();
  Tensor src = Tensor::empty({n * 3}, DType::f32);
  for (int i = 0; i < n * 3; ++i) src.data<float>()[i] = static_cast<float>(i + r);
  Tensor mine = test::poisoned({3}, DType::f32);
  w.reduce_scatter(src, mine, ReduceOp::sum);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(mine.data<float>()[i], static_cast<float>(n * (r * 3 + i) + n * (n - 1) / 2));
  Tensor all = test::poisoned({n * 3}, DType::f32);
  w.allgather(mine, all);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(all.data<float>()[q * 3 + i],
                static_cast<float>(n * (q * 3 + i) + n * (n - 1) / 2));
  // alltoall: chunk q of rank r holds 100 r + q; after it, chunk q holds 100 q + r.
  Tensor s = Tensor::empty({n, 2}, DType::i32), d = test::poisoned({n, 2}, DType::i32);
  for (int q = 0; q < n; ++q) s.data<int32_t>()[2 * q] = s.data<int32_t>()[2 * q + 1] = 100 * r + q;
  w.alltoall(s, d);
  for (int q = 0; q < n; ++q) EXPECT_EQ(d.data<int32_t>()[2 * q + 1], 100 * q + r);
}

TEST(Mpi, AlltoallvWithUnevenRows) {
  Communicator& w = test::mpi_world();
  const int r = w.rank(), n = w.size();
  // Rank r sends (r + q) % 3 rows of width 4 to rank q, each row filled with 1000 r + q.
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    send[static_cast<size_t>(q)] = (r + q) % 3;
    recv[static_cast<size_t>(q)] = (q + r) % 3;
  }
  const int64_t ns = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t nr = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  Tensor s = Tensor::empty({std::max<int64_t>(ns, 1), 4}, DType::f32),
         d = test::poisoned({std::max<int64_t>(nr, 1), 4}, DType::f32);
  int64_t row = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < send[static_cast<size_t>(q)]; ++k, ++row)
      for (int c = 0; c < 4; ++c) s.data<float>()[row * 4 + c] = static_cast<float>(1000 * r + q);
  w.alltoallv_async(s, send, d, recv)->wait();
  row = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < recv[static_cast<size_t>(q)]; ++k, ++row)
      EXPECT_EQ(d.data<float>()[row * 4 + 3], static_cast<float>(1000 * q + r));
}

TEST(Mpi, BroadcastSendRecvAndNonBlockingProgress) {
  Communicator& w = test::mpi_world();
  const int r = w.rank(), n = w.size();
  Tensor b = Tensor::empty({4}, DType::i64);
  b.fill(r == n - 1 ? 42.0 : -1.0);
  w.broadcast(b, n - 1);
  EXPECT_EQ(b.data<int64_t>()[3], 42);
  // A ring: send to r+1, receive from r-1, both posted before waiting.
  Tensor out = Tensor::empty({3}, DType::f32), in = test::poisoned({3}, DType::f32);
  out.fill(static_cast<double>(r));
  auto rx = w.recv_async(in, (r + n - 1) % n, 7);
  auto tx = w.send_async(out, (r + 1) % n, 7);
  tx->wait();
  rx->wait();
  EXPECT_EQ(in.data<float>()[0], static_cast<float>((r + n - 1) % n));
  // A non-blocking allreduce completes through test() polling.
  Tensor big = Tensor::empty({1 << 16}, DType::f32);
  big.fill(1.0);
  auto work = w.allreduce_async(big, ReduceOp::sum);
  while (!work->test()) {
  }
  EXPECT_EQ(big.data<float>()[12345], static_cast<float>(n));
}

TEST(Mpi, PollCompletesOutstandingOperations) {
  Communicator& w = test::mpi_world();
  const int r = w.rank(), n = w.size();
  // bf16 avg: the result reaches `b` only in the completion step (fp32 ->
  // bf16 rounding), so seeing it proves poll() completed the operation
  // without test() or wait().
  Tensor b = Tensor::empty({1 << 15}, DType::bf16);
  b.fill(static_cast<double>(2 * r));
  Tensor f = Tensor::empty({1 << 18}, DType::f32);  // a second one in flight at the same time
  f.fill(1.0);
  auto wb = w.allreduce_async(b, ReduceOp::avg);
  auto wf = w.allreduce_async(f, ReduceOp::sum);
  const uint16_t expect = f32_to_bf16(static_cast<float>(n - 1));
  const auto* bits = static_cast<const uint16_t*>(b.raw());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((bits[0] != expect || bits[(1 << 15) - 1] != expect) &&
         std::chrono::steady_clock::now() < deadline) {
    w.poll();
  }
  EXPECT_EQ(bits[0], expect) << "poll() did not complete the bf16 allreduce within 30 s";
  EXPECT_TRUE(wb->test());
  wf->wait();
  EXPECT_EQ(f.data<float>()[(1 << 18) - 1], static_cast<float>(n));
  w.poll();  // nothing in flight: a no-op
}

TEST(Mpi, CountsBytesAndSplitsIntoSubgroups) {
  auto w = make_mpi_world();  // a fresh communicator: its own counters
  const int n = w->size();
  Tensor f = Tensor::zeros({1000}, DType::f32);
  w->allreduce(f, ReduceOp::sum);
  w->allreduce(f, ReduceOp::sum);
  CommStats st = w->stats_for("allreduce");
  EXPECT_EQ(st.calls, 2);
  EXPECT_EQ(st.bytes_sent, 2 * 2 * 4000 * (n - 1) / n);  // ring: 2 (n-1)/n of the buffer per call
  EXPECT_GE(st.seconds, 0.0);
  auto sub = w->split(w->rank() % 2, w->rank());
  EXPECT_EQ(sub->size(), (n + 1 - w->rank() % 2) / 2);
  Tensor one = Tensor::empty({1}, DType::i32);
  one.data<int32_t>()[0] = 1;
  sub->allreduce(one, ReduceOp::sum);
  EXPECT_EQ(one.data<int32_t>()[0], sub->size());
  EXPECT_THROW(w->send_async(f, w->rank(), 0), Error);
}

std::atomic<int64_t> g_hook_calls{0};
void count_hook_call() noexcept {
  ++g_hook_calls;
}

// With a wait hook (comm/wait_hook.h) a blocking wait or barrier polls and
// calls it while another rank is late, and still returns the right sums.
TEST(Mpi, AWaitHookIsCalledWhileWaitingForALateRank) {
  Communicator& w = test::mpi_world();
  const int r = w.rank(), n = w.size();
  set_wait_hook(&count_hook_call);
  g_hook_calls = 0;
  if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Tensor f = Tensor::empty({1000}, DType::f32);
  f.fill(static_cast<double>(r + 1));
  w.allreduce(f, ReduceOp::sum);
  const int64_t after_allreduce = g_hook_calls.load();
  if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  w.barrier();
  const int64_t after_barrier = g_hook_calls.load() - after_allreduce;
  set_wait_hook(nullptr);
  EXPECT_EQ(f.data<float>()[999], static_cast<float>(n * (n + 1) / 2));
  if (r != 0) {  // they waited 0.2 s for rank 0, twice
    EXPECT_GT(after_allreduce, 0);
    EXPECT_GT(after_barrier, 0);
  }
  g_hook_calls = 0;
  w.allreduce(f, ReduceOp::sum);  // no hook: MPI_Waitall, nothing called
  EXPECT_EQ(g_hook_calls.load(), 0);
}

}  // namespace
}  // namespace moetron::comm
