#include <gtest/gtest.h>

#include "moetron/comm/communicator.h"
#include "util/test_util.h"

namespace moetron::comm {
namespace {

TEST(LocalCommunicator, CollectivesAreIdentitiesAndCounted) {
  auto c = make_local_communicator();
  EXPECT_EQ(c->size(), 1);
  Tensor x = test::random_tensor({6}, DType::f32, "x"), keep = x.clone();
  c->allreduce(x, ReduceOp::sum);
  EXPECT_TRUE(test::all_close(x, keep, {0, 0}));
  Tensor y = test::poisoned({6}, DType::f32);
  c->allgather(x, y);
  EXPECT_TRUE(test::all_close(y, keep, {0, 0}));
  EXPECT_EQ(c->stats_for("allreduce").calls, 1);
  EXPECT_EQ(c->total_stats().bytes_sent, 0);
  EXPECT_THROW(c->send(x, 1), Error);
  EXPECT_THROW(c->broadcast(x, 2), Error);
}

}  // namespace
}  // namespace moetron::comm
