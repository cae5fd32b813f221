// The CPU backend's persistent GEMM scratch where oneDNN has no bf16 matmul
// (oneDNN 2.6 without AVX512_CORE): every bf16 GEMM widens its operands into
// two fp32 slots and, for a bf16 output, computes into a third before
// rounding (kernels::cpu_gemm_slots says how large for each GEMM).
// A slot grows to the largest request it has seen and is kept by the
// context, so after the first step the three slots hold the largest GEMM
// operands of the step: at bench-moe scale the vocabulary head's weight
// (V x D) and its chunk's dlogits (chunk x V), ~80 MB in all at S 2048.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "moetron/kernels/matmul.h"
#include "moetron/planner/memory_replay.h"

namespace moetron::planner {

using GemmScratch = kernels::GemmSlots;  // fp32 elements per slot

// The slots' sizes after one step of this rank's chunks (zero when the
// compute dtype is not bf16: only bf16 GEMMs are widened).
GemmScratch widened_gemm_scratch(const MemoryInputs& in, const Dims& x,
                                 const std::vector<std::pair<int64_t, int64_t>>& chunks,
                                 bool last_stage);

}  // namespace moetron::planner
