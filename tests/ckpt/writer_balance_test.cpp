// Spreading the writing of replicated tensors over their replicas: every
// tensor gets exactly one writer, the loads differ by at most the largest
// tensor, and every replica computes the same answer.
#include "moetron/ckpt/writer_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "moetron/core/error.h"

namespace moetron::ckpt {
namespace {

TEST(WriterBalance, EveryTensorHasOneWriterAndTheLoadsAreEven) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> size(1, 100000);
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (int i = 0; i < 97; ++i) {
    std::string name = "t";
    name += std::to_string(i);
    sizes.emplace_back(name, size(rng));
  }
  for (const int replicas : {1, 2, 3, 4, 7}) {
    const auto writers = balance_writers(sizes, replicas);
    ASSERT_EQ(writers.size(), sizes.size());
    std::vector<int64_t> load(static_cast<size_t>(replicas), 0);
    int64_t largest = 0;
    for (const auto& [name, n] : sizes) {
      const int w = writers.at(name);
      ASSERT_GE(w, 0);
      ASSERT_LT(w, replicas);
      load[static_cast<size_t>(w)] += n;
      largest = std::max(largest, n);
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, largest) << replicas << " replicas";
    EXPECT_EQ(balance_writers(sizes, replicas), writers) << "not deterministic";
  }
}

TEST(WriterBalance, OneReplicaWritesEverythingAndZeroIsRefused) {
  const std::vector<std::pair<std::string, int64_t>> sizes = {{"a", 5}, {"b", 5}, {"c", 9}};
  for (const auto& [name, w] : balance_writers(sizes, 1)) EXPECT_EQ(w, 0) << name;
  // Two equal tensors on two replicas: one each.
  const auto two = balance_writers({{"a", 5}, {"b", 5}}, 2);
  EXPECT_NE(two.at("a"), two.at("b"));
  EXPECT_THROW(balance_writers(sizes, 0), Error);
}

}  // namespace
}  // namespace moetron::ckpt
