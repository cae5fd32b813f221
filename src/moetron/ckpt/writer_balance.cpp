#include "moetron/ckpt/writer_balance.h"

#include <algorithm>
#include <numeric>

#include "moetron/core/error.h"

namespace moetron::ckpt {

std::unordered_map<std::string, int> balance_writers(
    const std::vector<std::pair<std::string, int64_t>>& sizes, int replicas) {
  MOETRON_CHECK(replicas >= 1, "balance_writers: ", replicas, " replicas");
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a].second > sizes[b].second; });
  std::vector<int64_t> load(static_cast<size_t>(replicas), 0);
  std::unordered_map<std::string, int> out;
  for (const size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    *least += sizes[i].second;
    out[sizes[i].first] = static_cast<int>(least - load.begin());
  }
  return out;
}

}  // namespace moetron::ckpt
