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
// allocator sees (planner/memory_replay.h). Communication buffers (the
// reducers' gradient buckets, ZeRO-1's parameter all-gather, the ep
// exchanges) are tagged comm. tests/planner/memory_model_test.cpp (one rank)
// and memory_model_mpitest.cpp (dp, ZeRO-1, tp, ep and pp layouts) hold the
// model to within 10% of the allocator's measured peak.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/allocator.h"
#include "moetron/core/dtype.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/multimodal_config.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/recompute.h"
#include "moetron/parallel/grad_compressor.h"

namespace moetron::planner {

// One rank's place in a parallel layout, as it enters the memory model.
// dp ranks replicate the model (with zero1 the dense optimizer state is
// split over them); tp shards heads, the dense FFN and the vocabulary (and
// with sequence_parallel the block's token rows), and the MoE layers route
// 1/tp of the tokens (parallel folding); ep places num_experts / ep experts
// on each rank, whose rows are predicted for balanced routing (the one
// input the model cannot know before running: an imbalanced router moves
// the expert buffers, bounded by moe.capacity_factor when it is set); pp
// holds `stage`'s layers and replays its schedule over grad_accum
// micro-batches. cp is rejected until context parallelism exists.
struct Layout {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  // 2-D tensor parallelism (parallel.tp_2d): tp = tp_rows x C grid ranks.
  int64_t tp_rows = 1;
  bool zero1 = false;
  bool sequence_parallel = false;
  int64_t vpp = 1;
  std::string schedule = "1f1b";
  int64_t stage = 0;       // pipeline rank predicted, 0 .. pp - 1
  int64_t stage_rank = 0;  // which rank of the stage (dp x tp of them): its tp shard and experts
  // vpp 1: every stage's layers [first, end) as the job splits them; empty:
  // balanced by FLOPs (parallel::balanced_stages).
  std::vector<std::pair<int64_t, int64_t>> stages;
};

// Gradient buckets of the data-parallel reducers (parallel/grad_reducer.h).
struct ReducerInputs {
  int64_t bucket_bytes = 16 << 20;
  parallel::CompressOptions compress;
  bool preconditioned = false;  // ReducerOptions::preconditioned
};

struct MemoryInputs {
  nn::ModelConfig model;
  nn::MoeConfig moe;
  // The encoders' parameters (multimodal.enabled); their activations are
  // not modelled yet (they are recomputed in backward, nn/media_fusion.h).
  nn::MultimodalModelConfig media;
  nn::Precision precision = nn::Precision::bf16();
  std::string optimizer = "adamw";          // adamw | muon
  std::vector<std::string> adamw_patterns;  // kept on AdamW under muon
  nn::RecomputePolicy recompute;
  int64_t micro_batch = 1, seq_len = 1;
  // train.seq_chunk: positions per chunk of each sequence (0 or >= seq_len: whole).
  int64_t seq_chunk = 0;
  int64_t grad_accum = 1;  // micro-batches per step (the pipeline's m under pp)
  int64_t ce_chunk_tokens = 1024;
  int64_t threads = 1;  // OpenMP threads: per-thread kernel scratch
  Layout layout;
  ReducerInputs reducer;
  // Storage of the hidden matrices' gradients and of the optimizer moments
  // (f32, or bf16 where train.grad_dtype / optim.moment_dtype say so).
  DType matrix_grad = DType::f32;
  DType moment_dtype = DType::f32;
  // optim.master_dtype: bf16 parameters are their own (bf16) masters.
  DType master_dtype = DType::f32;
  bool factored_second_moment = false;  // optim.second_moment = "factored"
  // The CPU backend widens bf16 GEMMs to fp32 here (kernels::cpu_widens_bf16_matmul):
  // its persistent scratch (planner/gemm_scratch.h) is counted as workspace.
  bool widened_bf16_gemm = false;
  // parallel.cp_comm = "all_to_all": attention over the whole sequence for
  // 1/cp of the heads (nn/attention_ulysses.cpp) instead of the K/V ring.
  bool cp_all_to_all = false;
  // data.document_mask: under cp every ring distance may be seen.
  bool document_mask = false;
  // ZeRO-1 with Muon (optim.muon_distribution): "owner" buckets whole
  // matrices per rank; "replicated" gathers every update; "gather" gathers
  // the matrices a chunk boundary cuts.
  std::string muon_distribution = "owner";
};

struct MemoryEstimate {
  std::array<int64_t, kNumMemTags> peak{};  // per tag
  int64_t total_peak = 0;                   // peak of the sum
  int64_t param_count = 0;
  int64_t peak_of(MemTag t) const { return peak[static_cast<size_t>(t)]; }
};

// One rank's prediction (layout.stage's, under pp).
MemoryEstimate estimate_memory(const MemoryInputs& in);
// The largest total peak over the pipeline stages (every stage's rank of a
// layout fits when this does).
MemoryEstimate estimate_worst_stage(MemoryInputs in);

// Largest micro-batch (1 .. max_micro_batch) whose predicted total peak (the worst stage's) fits
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
