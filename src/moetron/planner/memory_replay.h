// The memory model's replay of a training step's activations and workspace
// (planner/memory_model.h): allocations and frees in the order nn/ makes
// them, each rounded as the allocator rounds it, so the peak comes out of
// the same timeline the allocator sees. One rank's share of a layout enters
// through `Dims` (its heads, FFN and vocabulary shards under tp, its token
// slices under sequence parallelism and for the MoE layers under tp, its
// experts' rows under ep) and, under pp, through the stage's chunks and its
// schedule.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "moetron/core/allocator.h"
#include "moetron/core/dtype.h"
#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::planner {

struct MemoryInputs;

// Running and peak bytes per tag and of their sum.
class Sim {
 public:
  void add(MemTag t, int64_t n) {
    cur_[static_cast<size_t>(t)] += n;
    total_ += n;
    peak_[static_cast<size_t>(t)] =
        std::max(peak_[static_cast<size_t>(t)], cur_[static_cast<size_t>(t)]);
    total_peak_ = std::max(total_peak_, total_);
  }
  const std::array<int64_t, kNumMemTags>& peak() const { return peak_; }
  int64_t total_peak() const { return total_peak_; }

 private:
  std::array<int64_t, kNumMemTags> cur_{}, peak_{};
  int64_t total_ = 0, total_peak_ = 0;
};

// An allocation that frees its bytes when its last handle goes, as a Tensor
// does, so the replay reads like the code it mirrors.
struct Held {
  Held(Sim* s, MemTag t, int64_t n) : sim(s), tag(t), bytes(n) {}
  ~Held() { sim->add(tag, -bytes); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  Sim* sim;
  MemTag tag;
  int64_t bytes;
};
using Buf = std::shared_ptr<Held>;

struct Replay {
  Sim sim;
  Buf alloc(int64_t elems, DType dt, MemTag tag = MemTag::activations);
  Buf ws(int64_t elems, DType dt) { return alloc(elems, dt, MemTag::workspace); }
};

// One rank's dimensions of a micro-batch.
struct Dims {
  int64_t b = 0, s = 0, t = 0;  // micro-batch rows, sequence, tokens (b s)
  int64_t tb = 0;  // rows of a block's norms and residuals (t / tp under sequence parallelism)
  int64_t tm = 0;  // tokens the MoE layers route (t / tp when tp > 1: folded)
  int64_t d = 0, h = 0, hkv = 0, hd = 0;  // h, hkv: this rank's heads
  int64_t ffn = 0;                        // this rank's dense FFN hidden units
  int64_t v = 0;                          // this rank's vocabulary rows
  int64_t e = 1, k = 0, f = 0;            // experts (router width), top-k, expert hidden
  int64_t rows_local = 0;                 // (token, expert) slots this rank routes (after capacity)
  int64_t rows_expert = 0;  // rows this rank's experts run (balanced routing assumed under ep)
  int64_t shared_hidden = 0;
  int64_t threads = 1;
  int64_t tp = 1, ep = 1;  // tp: a 2-D grid's row (its columns, C)
  int64_t grid_rows = 1;   // R of a 2-D grid (1: 1-D tp)
  // Context parallelism: s, t are this rank's two chunks of each sequence;
  // cp_seq the whole sequence, cp_rank this rank's place on the ring.
  int64_t cp = 1, cp_rank = 0, cp_seq = 0;
  bool cp_all_to_all = false;  // attention by all-to-all (Ulysses), not the ring
  bool sp = false;
  DType c = DType::f32, a = DType::f32;
  bool aux = false, z = false;
};

// Replays forward and backward of the micro-batches of one step into `r`:
// with one pipeline stage, one micro-batch (the next reuses its memory) with
// the policy's checkpointed segments; under pp, the stage's schedule, each
// micro-batch's saved tensors held from its forward to its backward. With
// seq_chunks (train.seq_chunk: each chunk's dims, x the whole sequence's),
// one micro-batch's chunks forward, then backward in reverse.
void replay_step(Replay& r, const MemoryInputs& in, const Dims& x,
                 const std::vector<std::pair<int64_t, int64_t>>& chunks, bool first_stage,
                 bool last_stage, const std::vector<Dims>& seq_chunks = {});

}  // namespace moetron::planner
