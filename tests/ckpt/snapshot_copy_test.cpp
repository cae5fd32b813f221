// Where in-memory snapshots keep their neighbour copies: the ring shift puts
// every rank's copy on another machine, none on a single machine (a copy
// there would die with the original), and is a permutation.
#include <gtest/gtest.h>

#include <set>

#include "moetron/ckpt/snapshot.h"
#include "moetron/core/error.h"

namespace moetron::ckpt {
namespace {

void expect_apart(const std::vector<int64_t>& hosts, int shift) {
  const int n = static_cast<int>(hosts.size());
  std::set<int> targets;
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(hosts[r], hosts[(r + shift) % n]) << "rank " << r << " shift " << shift;
    targets.insert((r + shift) % n);
  }
  EXPECT_EQ(static_cast<int>(targets.size()), n);
}

TEST(SnapshotCopy, OtherHostSkipsTheRanksOfTheSameMachine) {
  const std::vector<int64_t> two_by_four = {7, 7, 7, 7, 9, 9, 9, 9};
  EXPECT_EQ(copy_shift(two_by_four, SnapshotCopy::other_host), 4);
  expect_apart(two_by_four, 4);
  const std::vector<int64_t> round_robin = {1, 2, 3, 1, 2, 3};
  EXPECT_EQ(copy_shift(round_robin, SnapshotCopy::other_host), 1);
  const std::vector<int64_t> uneven = {1, 1, 1, 2, 2, 3};
  const int s = copy_shift(uneven, SnapshotCopy::other_host);
  ASSERT_GT(s, 0);
  expect_apart(uneven, s);
}

TEST(SnapshotCopy, OneMachineKeepsNoCopyUnlessAskedToAlways) {
  const std::vector<int64_t> one = {5, 5, 5, 5};
  EXPECT_EQ(copy_shift(one, SnapshotCopy::other_host), 0);
  EXPECT_EQ(copy_shift(one, SnapshotCopy::always), 1);
  EXPECT_EQ(copy_shift(one, SnapshotCopy::off), 0);
  EXPECT_EQ(copy_shift({5}, SnapshotCopy::always), 0);  // one rank: nobody to copy to
  // Most of the ranks on one machine: no shift separates them all.
  EXPECT_EQ(copy_shift({1, 1, 1, 2}, SnapshotCopy::other_host), 0);
}

TEST(SnapshotCopy, AnUnknownPolicyNamesTheKey) {
  EXPECT_EQ(parse_snapshot_copy("other_host"), SnapshotCopy::other_host);
  try {
    parse_snapshot_copy("sometimes");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.snapshot_copy"), std::string::npos);
  }
}

}  // namespace
}  // namespace moetron::ckpt
