// moe_plan: plain C++ on the router's topk_idx, one implementation for every
// backend (the plan is bookkeeping, not numerics, so the backends must agree
// on it bit for bit; a device backend copies the result to the device).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "moetron/kernels/moe.h"

namespace moetron::kernels {

MoePlan moe_plan(const Tensor& topk_idx, int64_t num_experts, int64_t capacity) {
  return moe_plan_limited(
      topk_idx, num_experts,
      std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(num_experts, 0)),
                           capacity > 0 ? capacity : -1));
}

MoePlan moe_plan_limited(const Tensor& topk_idx, int64_t num_experts,
                         const std::vector<int64_t>& limits) {
  MOETRON_CHECK(topk_idx.defined() && topk_idx.rank() == 2 && topk_idx.dtype() == DType::i32,
                "moe_plan: topk_idx must be i32 [T, K], got ",
                topk_idx.defined() ? topk_idx.str() : std::string("undefined"));
  MOETRON_CHECK(topk_idx.device() == Device::cpu, "moe_plan: topk_idx must be in host memory");
  MOETRON_CHECK(num_experts >= 1, "moe_plan: num_experts must be >= 1, got ", num_experts);
  MOETRON_CHECK(static_cast<int64_t>(limits.size()) == num_experts, "moe_plan: ", limits.size(),
                " limits for ", num_experts, " experts");
  const int64_t T = topk_idx.dim(0), K = topk_idx.dim(1);
  MOETRON_CHECK(T * K < INT32_MAX, "moe_plan: ", T, " x ", K, " slots overflow i32 rows");
  const int32_t* idx = topk_idx.data<int32_t>();

  MoePlan plan;
  plan.num_tokens = T;
  plan.top_k = K;
  plan.num_experts = num_experts;

  // Pass 1: check every index before anything is decided, and count the
  // slots each expert keeps; slots are visited in (token, k) order, so under
  // a capacity the earlier tokens are the ones kept.
  std::vector<int64_t> kept(static_cast<size_t>(num_experts), 0);
  for (int64_t s = 0; s < T * K; ++s) {
    const int32_t e = idx[s];
    MOETRON_CHECK(e >= 0 && e < num_experts, "moe_plan: topk_idx[", s / K, ", ", s % K, "] = ", e,
                  " is not an expert in [0, ", num_experts, ")");
  }
  plan.row_of_slot.assign(static_cast<size_t>(T * K), -1);
  for (int64_t s = 0; s < T * K; ++s) {
    int64_t& n = kept[static_cast<size_t>(idx[s])];
    const int64_t limit = limits[static_cast<size_t>(idx[s])];
    if (limit >= 0 && n >= limit) {
      ++plan.dropped;
      continue;
    }
    // Provisional: the slot's position inside its expert's block.
    plan.row_of_slot[static_cast<size_t>(s)] = static_cast<int32_t>(n);
    ++n;
  }

  plan.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    plan.offsets[static_cast<size_t>(e + 1)] =
        plan.offsets[static_cast<size_t>(e)] + kept[static_cast<size_t>(e)];
  }

  // Pass 2: shift each position by its expert's offset, and invert.
  plan.token_of_row.assign(static_cast<size_t>(plan.rows()), 0);
  for (int64_t s = 0; s < T * K; ++s) {
    int32_t& row = plan.row_of_slot[static_cast<size_t>(s)];
    if (row < 0) continue;
    row += static_cast<int32_t>(plan.offsets[static_cast<size_t>(idx[s])]);
    plan.token_of_row[static_cast<size_t>(row)] = static_cast<int32_t>(s / K);
  }
  return plan;
}

}  // namespace moetron::kernels
