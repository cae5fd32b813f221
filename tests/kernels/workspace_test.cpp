// The scratch each kernel family reports (kernels/workspace.h) against what
// the allocator sees: a call's workspace peak above what was held before it
// equals workspace_bytes() of the reported list, on awkward shapes, f32,
// bf16 and f16 (staged), one and three threads. The memory model sizes the
// kernels from these reports (planner/memory_replay.cpp), so a buffer added
// to a kernel and not to its report fails here.
#include "moetron/kernels/workspace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <sstream>
#include <string>

#include "moetron/core/allocator.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/attention.h"
#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/norm.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::random_tensor;

// The workspace bytes `call` adds at its peak to what is held before it.
// The call runs twice and the second is measured: the first creates the
// context's lazily built state and grows the CPU matmul's persistent slots
// (kernels/cpu/cpu_state.h), which are not a call's scratch.
int64_t measured_workspace(const std::function<void()>& call) {
  call();
  Allocator& a = cpu_allocator();
  const int64_t before = a.current(MemTag::workspace);
  a.reset_peaks();
  call();
  EXPECT_EQ(a.current(MemTag::workspace), before) << "the call kept workspace after returning";
  return a.peak(MemTag::workspace) - before;
}

Tensor ids_below(int64_t n, int64_t bound, const std::string& name) {
  Tensor t = Tensor::empty({n}, DType::i32, MemTag::workspace);
  PhiloxStream rng(11, name);
  for (int64_t i = 0; i < n; ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(bound));
  }
  return t;
}

TEST(Workspace, BytesRoundEachBufferAndCountThreads) {
  Scratch s;
  add_scratch(s, 1, DType::f32);          // 4 bytes -> 64
  add_scratch(s, 17, DType::bf16, true);  // 34 bytes -> 64, per thread
  add_scratch(s, 0, DType::f32, true);    // not listed
  add_scratch(s, 33, DType::f32);         // 132 -> 192
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(workspace_bytes(s, 1), 64 + 64 + 192);
  EXPECT_EQ(workspace_bytes(s, 3), 64 + 3 * 64 + 192);
  EXPECT_THROW(workspace_bytes(s, 0), Error);
}

struct AttnCase {
  AttentionShape shape;
  AttentionMask mask;
};

std::string describe(const AttentionShape& s, int threads) {
  std::ostringstream os;
  os << dtype_name(s.dtype) << " B" << s.batch << " Sq" << s.seq_q << " Sk" << s.seq_k << " H"
     << s.heads << "/" << s.kv_heads << " hd" << s.head_dim << " threads " << threads;
  return os.str();
}

TEST(Workspace, AttentionReportsWhatTheAllocatorSees) {
  const std::vector<AttnCase> cases = {
      {{.batch = 2, .seq_q = 70, .seq_k = 70, .heads = 6, .kv_heads = 2, .head_dim = 20}, {}},
      {{.batch = 1, .seq_q = 33, .seq_k = 130, .heads = 3, .kv_heads = 3, .head_dim = 1},
       {.causal = true, .q_offset = 97}},
      {{.batch = 3, .seq_q = 1, .seq_k = 7, .heads = 4, .kv_heads = 1, .head_dim = 33},
       {.causal = false}},
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int threads : {1, 3}) {
      Context ctx(Backend::cpu, threads);
      for (AttnCase c : cases) {
        c.shape.dtype = dt;
        const AttentionShape& s = c.shape;
        const std::string what = describe(s, threads);
        const Tensor q = random_tensor({s.batch, s.seq_q, s.heads, s.head_dim}, dt, "q" + what);
        const Tensor k = random_tensor({s.batch, s.seq_k, s.kv_heads, s.head_dim}, dt, "k" + what);
        const Tensor v = random_tensor(k.shape(), dt, "v" + what);
        const Tensor dout = random_tensor(q.shape(), dt, "dout" + what);
        const Tensor out = test::poisoned(q.shape(), dt), dq = test::poisoned(q.shape(), dt);
        const Tensor dk = test::poisoned(k.shape(), dt), dv = test::poisoned(k.shape(), dt);
        const Tensor lse = test::poisoned({s.batch, s.heads, s.seq_q}, DType::f32);
        const float scale = 0.3f;
        const int64_t fwd =
            measured_workspace([&] { attention_forward(ctx, q, k, v, c.mask, scale, out, lse); });
        EXPECT_EQ(fwd, workspace_bytes(attention_forward_scratch(Backend::cpu, s), threads))
            << "forward " << what;
        const int64_t bwd = measured_workspace(
            [&] { attention_backward(ctx, dout, q, k, v, out, lse, c.mask, scale, dq, dk, dv); });
        EXPECT_EQ(bwd, workspace_bytes(attention_backward_scratch(Backend::cpu, s), threads))
            << "backward " << what;
      }
    }
  }
}

TEST(Workspace, RmsnormBackwardReportsWhatTheAllocatorSees) {
  Context ctx(Backend::cpu, 3);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t rows : {1, 7, 33, 130, 5000}) {
      const int64_t cols = 24;
      const std::string what = std::string(dtype_name(dt)) + " rows " + std::to_string(rows);
      const Tensor x = random_tensor({rows, cols}, dt, "x" + what);
      const Tensor dy = random_tensor({rows, cols}, dt, "dy" + what);
      const Tensor w = random_tensor({cols}, DType::f32, "w" + what);
      const Tensor rstd = random_tensor({rows}, DType::f32, "rstd" + what, 0.5f, 2.0f);
      const Tensor dx = test::poisoned({rows, cols}, dt);
      const Tensor dw = Tensor::zeros({cols}, DType::f32, MemTag::workspace);
      const int64_t got =
          measured_workspace([&] { rmsnorm_backward(ctx, dy, x, w, rstd, dx, dw); });
      EXPECT_EQ(got, workspace_bytes(rmsnorm_backward_scratch(Backend::cpu, rows, cols, dt), 3))
          << what;
    }
  }
}

TEST(Workspace, EmbeddingBackwardReportsWhatTheAllocatorSees) {
  Context ctx(Backend::cpu, 3);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t tokens : {1, 33, 130}) {
      const int64_t rows = 13, dim = 20, offset = 7;  // ids in [0, 26): half are other ranks'
      const std::string what = std::string(dtype_name(dt)) + " T " + std::to_string(tokens);
      const Tensor ids = ids_below(tokens, 2 * rows, what);
      const Tensor dout = random_tensor({tokens, dim}, dt, "dout" + what);
      const Tensor dtable = Tensor::zeros({rows, dim}, DType::f32, MemTag::workspace);
      const int64_t got =
          measured_workspace([&] { embedding_backward(ctx, ids, dout, dtable, offset); });
      EXPECT_EQ(got,
                workspace_bytes(embedding_backward_scratch(Backend::cpu, tokens, rows, dim, dt), 3))
          << what;
    }
  }
}

TEST(Workspace, FusedCrossEntropyReportsWhatTheAllocatorSees) {
  Context ctx(Backend::cpu, 3);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t chunk : {7, 64}) {
      for (int grads = 0; grads < 4; ++grads) {
        CrossEntropyFusedShape s{.tokens = 33,
                                 .vocab = 130,
                                 .dim = 24,
                                 .chunk_tokens = chunk,
                                 .dtype = dt,
                                 .d_hidden = (grads & 1) != 0,
                                 .d_head_w = (grads & 2) != 0};
        const std::string what = std::string(dtype_name(dt)) + " chunk " + std::to_string(chunk) +
                                 " grads " + std::to_string(grads);
        const Tensor h = random_tensor({s.tokens, s.dim}, dt, "h" + what);
        const Tensor w = random_tensor({s.vocab, s.dim}, dt, "w" + what);
        const Tensor targets = ids_below(s.tokens, s.vocab, what);
        const Tensor losses = test::poisoned({s.tokens}, DType::f32);
        const Tensor dh = s.d_hidden ? test::poisoned({s.tokens, s.dim}, dt) : Tensor();
        const Tensor dw =
            s.d_head_w ? Tensor::zeros({s.vocab, s.dim}, DType::f32, MemTag::workspace) : Tensor();
        const int64_t got = measured_workspace(
            [&] { cross_entropy_fused(ctx, h, w, targets, 0.1f, chunk, losses, dh, dw); });
        EXPECT_EQ(got, workspace_bytes(cross_entropy_fused_scratch(Backend::cpu, s), 3)) << what;
      }
    }
  }
}

// The CPU matmul's fp32 slots persist in the context and grow to the
// largest request (kernels::cpu_gemm_slots): after a run of GEMMs a fresh
// context holds exactly each slot's maximum, rounded. Which slots a machine
// uses depends on whether its oneDNN has a bf16 matmul; the sizes come from
// the same question.
TEST(Workspace, GemmSlotsAreWhatTheContextKeeps) {
  struct Gemm {
    int64_t m, n, k;
    DType ab, c;
    bool trans_b;
  };
  const std::vector<Gemm> gemms = {{7, 33, 130, DType::bf16, DType::bf16, true},
                                   {33, 7, 13, DType::f32, DType::bf16, false},
                                   {130, 1, 7, DType::bf16, DType::f32, false},
                                   {1, 130, 33, DType::f32, DType::f32, true}};
  const bool widens = cpu_widens_bf16_matmul();
  std::vector<std::array<Tensor, 3>> operands;
  GemmSlots most;
  for (const Gemm& g : gemms) {
    const std::string what = std::to_string(g.m) + "x" + std::to_string(g.n);
    const Shape b_shape = g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n};
    operands.push_back({random_tensor({g.m, g.k}, g.ab, "a" + what),
                        random_tensor(b_shape, g.ab, "b" + what), test::poisoned({g.m, g.n}, g.c)});
    const GemmSlots s = cpu_gemm_slots(g.m, g.n, g.k, g.ab, g.c, widens);
    most.staged_out = std::max(most.staged_out, s.staged_out);
    most.widened_a = std::max(most.widened_a, s.widened_a);
    most.widened_b = std::max(most.widened_b, s.widened_b);
  }
  Allocator& a = cpu_allocator();
  const int64_t before = a.current(MemTag::workspace);
  {
    Context ctx(Backend::cpu, 2);
    for (size_t i = 0; i < gemms.size(); ++i) {
      const auto& [x, w, y] = operands[i];
      matmul(ctx, x, w, y, {.trans_b = gemms[i].trans_b});
    }
    Scratch slots;
    for (int64_t n : {most.staged_out, most.widened_a, most.widened_b}) {
      add_scratch(slots, n, DType::f32);
    }
    EXPECT_EQ(a.current(MemTag::workspace) - before, workspace_bytes(slots, 1))
        << (widens ? "widening" : "native") << " bf16 matmul";
  }
  EXPECT_EQ(a.current(MemTag::workspace), before) << "the context frees its slots";
}

// The reference keeps its doubles in uncounted vectors and reports nothing.
TEST(Workspace, ReferenceReportsNothing) {
  const AttentionShape s{.batch = 1,
                         .seq_q = 7,
                         .seq_k = 7,
                         .heads = 2,
                         .kv_heads = 1,
                         .head_dim = 5,
                         .dtype = DType::f64};
  Context ref(Backend::reference);
  const Tensor q = random_tensor({1, 7, 2, 5}, DType::f64, "ref q");
  const Tensor k = random_tensor({1, 7, 1, 5}, DType::f64, "ref k");
  const Tensor out = test::poisoned(q.shape(), DType::f64);
  const Tensor lse = test::poisoned({1, 2, 7}, DType::f64);
  EXPECT_EQ(measured_workspace([&] { attention_forward(ref, q, k, k, {}, 0.5f, out, lse); }), 0);
  EXPECT_TRUE(attention_forward_scratch(Backend::reference, s).empty());
  EXPECT_TRUE(attention_backward_scratch(Backend::reference, s).empty());
  EXPECT_TRUE(rmsnorm_backward_scratch(Backend::reference, 7, 5, DType::f64).empty());
  EXPECT_TRUE(embedding_backward_scratch(Backend::reference, 7, 5, 3, DType::f64).empty());
  EXPECT_TRUE(cross_entropy_fused_scratch(Backend::reference,
                                          {.tokens = 7, .vocab = 5, .dim = 3, .dtype = DType::f64})
                  .empty());
}

}  // namespace
}  // namespace moetron::kernels
