// Helpers shared by the MoE kernel tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/core/tensor.h"

namespace moetron::kernels::test_moe {

// Distinct random experts per token (what a router produces), i32 [T, K].
inline Tensor random_topk_idx(int64_t T, int64_t E, int64_t K, const std::string& name,
                              uint64_t seed = 7) {
  Tensor idx = Tensor::empty({T, K}, DType::i32, MemTag::workspace);
  PhiloxStream rng(seed, name);
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; --i) {
      std::swap(perm[static_cast<size_t>(i)], perm[rng.next_u32() % static_cast<uint32_t>(i + 1)]);
    }
    for (int64_t k = 0; k < K; ++k) idx.data<int32_t>()[t * K + k] = perm[static_cast<size_t>(k)];
  }
  return idx;
}

}  // namespace moetron::kernels::test_moe
