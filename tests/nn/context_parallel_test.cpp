// Context parallelism's bookkeeping (nn/context_parallel.h), without ranks:
// which chunks a rank holds, its rows of a batch, and which ring distances
// a layer's mask can see. The numerics are tested against one rank under
// mpirun (tests/train/context_parallel_mpitest.cpp).
#include "moetron/nn/context_parallel.h"

#include <gtest/gtest.h>

#include <vector>

#include "moetron/core/error.h"

namespace moetron::nn {
namespace {

ContextParallel cp_of(int64_t size, int64_t rank, int64_t seq) {
  ContextParallel cp;
  cp.size = size;
  cp.rank = rank;
  cp.seq = seq;
  return cp;
}

kernels::AttentionMask local_mask(int64_t window, int64_t global) {
  kernels::AttentionMask m;
  m.window = window;
  m.num_global = global;
  return m;
}

TEST(ContextParallel, RankRHoldsChunksRAndTwoCMinusOneMinusR) {
  // S = 16 over cp 4: chunks of 2; rank 1 holds chunks 1 and 6.
  const ContextParallel cp = cp_of(4, 1, 16);
  EXPECT_EQ(cp.chunk(), 2);
  EXPECT_EQ(cp.local_seq(), 4);
  EXPECT_EQ(cp.chunk_offset(1, 0), 2);
  EXPECT_EQ(cp.chunk_offset(1, 1), 12);
  EXPECT_EQ((std::vector<int64_t>{cp.position_of(1, 0), cp.position_of(1, 1), cp.position_of(1, 2),
                                  cp.position_of(1, 3)}),
            (std::vector<int64_t>{2, 3, 12, 13}));
  Tensor ids = Tensor::empty({2, 16}, DType::i32);
  for (int64_t i = 0; i < 32; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i);
  const Tensor mine = context_local_rows(cp, ids, 2);
  ASSERT_EQ(mine.shape(), (Shape{2, 4}));
  EXPECT_EQ((std::vector<int32_t>(mine.data<int32_t>(), mine.data<int32_t>() + 8)),
            (std::vector<int32_t>{2, 3, 12, 13, 18, 19, 28, 29}));
  // Every position is held by exactly one rank.
  std::vector<int> held(16, 0);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t j = 0; j < cp.local_seq(); ++j) ++held[static_cast<size_t>(cp.position_of(r, j))];
  }
  EXPECT_EQ(held, std::vector<int>(16, 1));
}

TEST(ContextParallel, SplitsThatDoNotDivideAreRefusedByKey) {
  try {
    check_context_split(cp_of(3, 0, 16), 16);
    ADD_FAILURE() << "16 tokens split into 6 chunks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp = 3"), std::string::npos) << e.what();
  }
}

TEST(ContextParallel, RingDistancesAreThoseSomeRankCanSee) {
  using V = std::vector<int64_t>;
  // Full causal: every distance.
  EXPECT_EQ(context_ring_offsets(cp_of(4, 0, 16), local_mask(0, 0)), (V{1, 2, 3}));
  EXPECT_EQ(context_ring_offsets(cp_of(2, 0, 16), local_mask(0, 0)), (V{1}));
  // A window inside one chunk: only the neighbours' chunks (rank r - 1 holds
  // chunk r - 1, rank r + 1 = r - (c - 1) holds chunk 2c - 2 - r).
  EXPECT_EQ(context_ring_offsets(cp_of(4, 0, 16), local_mask(3, 0)), (V{1, 3}));
  EXPECT_EQ(context_ring_offsets(cp_of(8, 3, 1024), local_mask(32, 0)), (V{1, 7}));
  // A window reaching two chunks back, global tokens, packed documents: all.
  EXPECT_EQ(context_ring_offsets(cp_of(4, 0, 16), local_mask(4, 0)), (V{1, 2, 3}));
  EXPECT_EQ(context_ring_offsets(cp_of(4, 0, 16), local_mask(3, 1)), (V{1, 2, 3}));
  ContextParallel docs = cp_of(4, 0, 16);
  docs.documents = true;
  EXPECT_EQ(context_ring_offsets(docs, local_mask(3, 0)), (V{1, 2, 3}));
  // A window of one position sees only itself: no exchange at all.
  EXPECT_EQ(context_ring_offsets(cp_of(4, 0, 16), local_mask(1, 0)), V{});
}

}  // namespace
}  // namespace moetron::nn
