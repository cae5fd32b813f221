// The dashboard's bounded history: lines after a key, paging, thinning that
// keeps the whole run at a coarser resolution, dropping the oldest events.
#include "moetron/monitor/line_history.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moetron/core/error.h"

namespace moetron::monitor {
namespace {

std::vector<int64_t> keys_of(const HistoryPage& page) {
  std::vector<int64_t> keys;
  for (const auto& line : nlohmann::json::parse(page.json)) keys.push_back(line["k"]);
  return keys;
}

std::string line(int64_t k) {
  return nlohmann::json{{"k", k}}.dump();
}

TEST(LineHistory, AnswersTheLinesAfterAKey) {
  LineHistory h(100, 1 << 20, HistoryOverflow::thin);
  EXPECT_EQ(h.after(-1, 10).json, "[]");
  EXPECT_EQ(h.after(-1, 10).last_key, -1);
  for (int64_t k = 0; k < 10; ++k) h.append(k, line(k));
  EXPECT_EQ(keys_of(h.after(6, 100)), (std::vector<int64_t>{7, 8, 9}));
  const HistoryPage first = h.after(-1, 4);
  EXPECT_EQ(keys_of(first), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(first.last_key, 3);
  EXPECT_EQ(first.count, 4u);
  EXPECT_EQ(keys_of(h.after(first.last_key, 4)), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(h.after(9, 10).json, "[]");
  EXPECT_EQ(h.last_key(-1), 9);
}

TEST(LineHistory, ThinningKeepsTheWholeRunAndTheNewestLine) {
  LineHistory h(8, 1 << 20, HistoryOverflow::thin);
  for (int64_t k = 1; k <= 100; ++k) {
    h.append(k, line(k));
    ASSERT_LE(h.size(), 8u);
  }
  const std::vector<int64_t> keys = keys_of(h.after(-1, 100));
  EXPECT_EQ(keys.back(), 100);
  EXPECT_LT(keys.front(), 30);  // still reaches back to the run's start
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
}

TEST(LineHistory, DropOldestAndTheByteBound) {
  LineHistory events(3, 1 << 20, HistoryOverflow::drop_oldest);
  for (int64_t k = 0; k < 5; ++k) events.append(k, line(k));
  EXPECT_EQ(keys_of(events.after(-1, 10)), (std::vector<int64_t>{2, 3, 4}));

  const size_t one = line(0).size();
  LineHistory bytes(100, 3 * one, HistoryOverflow::drop_oldest);
  for (int64_t k = 0; k < 5; ++k) bytes.append(k, line(k));
  EXPECT_EQ(bytes.size(), 3u);
  EXPECT_LE(bytes.bytes(), 3 * one);
  EXPECT_THROW(LineHistory(1, 10, HistoryOverflow::thin), Error);
}

}  // namespace
}  // namespace moetron::monitor
