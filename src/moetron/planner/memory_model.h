// The memory model: per-rank peak bytes per allocator tag of a training step
// for a model, a layout, a recompute policy and a precision mode, predicted
// without allocating the model (so it also answers for models that would
// not fit here).
//
// Parameters, gradients and optimizer state are enumerated tensor by tensor
// as the model and the optimizer allocate them (exact to the byte).
// Activations and workspace are predicted by replaying the step's
// allocations and frees in the order the modules make them (forward, the
// cross-entropy, backward with the policy's rebuilds), each size rounded as
// the allocator rounds it, so the peak comes out of the same timeline the
// allocator sees. tests/planner/memory_model_test.cpp holds the model to
// within 10% of the allocator's measured peak.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/allocator.h"
#include "moetron/core/dtype.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/recompute.h"

namespace moetron::planner {

// A parallel layout as it enters the memory model. Data parallelism is
// modelled (each rank holds the whole model; with zero1 the optimizer state,
// fp32 master weights and moments, is split over the dp ranks). tp, pp, ep
// and cp are rejected until their layouts exist.
struct Layout {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  bool zero1 = false;
};

struct MemoryInputs {
  nn::ModelConfig model;
  nn::MoeConfig moe;
  nn::Precision precision = nn::Precision::bf16();
  std::string optimizer = "adamw";          // adamw | muon
  std::vector<std::string> adamw_patterns;  // kept on AdamW under muon
  nn::RecomputePolicy recompute;
  int64_t micro_batch = 1, seq_len = 1, grad_accum = 1;
  int64_t ce_chunk_tokens = 1024;
  int64_t threads = 1;  // OpenMP threads: per-thread kernel scratch
  Layout layout;
};

struct MemoryEstimate {
  std::array<int64_t, kNumMemTags> peak{};  // per tag
  int64_t total_peak = 0;                   // peak of the sum
  int64_t param_count = 0;
  int64_t peak_of(MemTag t) const { return peak[static_cast<size_t>(t)]; }
};

MemoryEstimate estimate_memory(const MemoryInputs& in);

// Largest micro-batch (1 .. max_micro_batch) whose predicted total peak fits
// in `budget_bytes`; 0 when even 1 does not fit.
int64_t largest_fitting_micro_batch(MemoryInputs in, int64_t budget_bytes,
                                    int64_t max_micro_batch = 4096);

// "512 MiB", "1.50 GiB".
std::string format_bytes(int64_t bytes);
// Parses "24GiB", "512MB", "1.5G", "1048576" (bytes). Errors name `what`.
int64_t parse_bytes(const std::string& text, const std::string& what);
// Bytes of memory the machine can give now (MemAvailable of /proc/meminfo).
int64_t available_memory_bytes();

}  // namespace moetron::planner
