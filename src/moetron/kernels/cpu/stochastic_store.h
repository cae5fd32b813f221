// The CPU side of stochastic rounding (kernels/stochastic_round.h): a
// 16-lane fp32 vector stored into bf16 with each lane's own random bits.
#pragma once

#include <cstdint>

#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::cpu {

// Lanes [0, min(count, 16)) of v into p[0..), lane j rounded with
// rounding_bits(key, index0 + j): the element's index in its whole tensor,
// so the bits do not depend on how the loop is blocked or threaded.
inline void store16_stochastic(bf16* p, simd::vf v, int64_t count, uint32_t key, int64_t index0) {
  alignas(64) float lanes[16];
  store16(lanes, v, lane_mask(16));
  const int64_t c = count < 16 ? count : 16;
  for (int64_t j = 0; j < c; ++j) p[j].bits = bf16_stochastic(lanes[j], key, index0 + j);
}

}  // namespace moetron::kernels::cpu
