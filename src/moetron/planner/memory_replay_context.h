// The memory replay (memory_replay.h) of context-parallel attention: what
// nn/attention_context_parallel.cpp (the ring) and nn/attention_ulysses.cpp
// (all-to-all) allocate, in their order, for the layer being replayed.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "moetron/kernels/workspace.h"
#include "moetron/planner/memory_model.h"
#include "moetron/planner/memory_replay.h"

namespace moetron::planner {

class ContextAttentionReplay {
 public:
  // `x` is the replay's current dims (held by reference: the step replay
  // changes them between micro-batches).
  ContextAttentionReplay(Replay& r, const MemoryInputs& in, const Dims& x)
      : r_(r), in_(in), x_(x) {}

  // Ring forward of `layer` after q, k, v, out and lse: returns the whole
  // sequence's K and V, kept as the layer's.
  std::pair<Buf, Buf> ring_forward(int64_t layer);
  // attn_core recompute from the saved K/V: each local chunk over its prefix.
  void prefix_forward();
  // Backward over the prefixes, dK/dV sums and their reduce-scatter.
  void ring_backward();

  // All-to-all: q, k, v become head-split (the given buffers replaced), lse
  // too, then ulysses_core.
  void ulysses_forward(Buf& q, Buf& k, Buf& v, Buf& lse, Buf& out, Buf& out_heads);
  // The head-split output, the whole-sequence kernel, the output's way back.
  void ulysses_core(Buf& out, Buf& out_heads);
  void ulysses_backward();

 private:
  std::vector<Buf> hold(const kernels::Scratch& scratch);
  std::vector<Buf> attention_scratch(bool backward, int64_t batch, int64_t seq_q, int64_t seq_k,
                                     int64_t head_share);
  // C positions per chunk, and the longest key prefix this rank's queries
  // reach (its second chunk's end).
  int64_t chunk() const { return x_.cp_seq / (2 * x_.cp); }
  int64_t longest_prefix() const { return (2 * x_.cp - x_.cp_rank) * chunk(); }
  // One all-to-all of `elems` a rank: send and receive buffers around it;
  // exchange_heads keeps the result.
  Buf exchange_heads(int64_t elems);
  void exchange_back(int64_t elems);

  Replay& r_;
  const MemoryInputs& in_;
  const Dims& x_;
};

}  // namespace moetron::planner
