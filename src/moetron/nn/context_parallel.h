// Context parallelism (parallel.cp = c): every sequence of S tokens is cut
// into 2c chunks of S / 2c, and cp rank r holds chunks r and 2c - 1 - r.
// Under a causal mask chunk i costs about i + 1/2 chunks of attention, so
// this pairing gives every rank the same work (Megatron-Core's and Llama 3's
// load balance). Token-wise modules (norms, MLP, MoE, the head) run on the
// rank's 2 S / 2c tokens as if they were a sequence of their own; RoPE gets
// their positions in the whole sequence; attention
// (nn/attention_context_parallel.cpp) passes keys and values around the cp
// ring and sends dK, dV back to the ranks that own them.
//
// The cp ranks of one data-parallel replica read the same rows: every rank
// slices its chunks out of the whole micro-batch (context_slice), so the
// data pipeline does not know about cp.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/attention.h"

namespace moetron::nn {

struct ContextParallel {
  int64_t size = 1;
  int64_t rank = 0;
  comm::Communicator* group = nullptr;  // the cp ranks, ordered by cp rank
  int64_t seq = 0;                      // S of the micro-batch in flight (set before forward)
  // Packed documents (each starting with global tokens): every ring step
  // may be seen. Set by the model, the same on every rank.
  bool documents = false;
  // Attention by all-to-all (whole sequence, 1/c of the heads per rank;
  // nn/attention_ulysses.cpp) instead of the K/V ring.
  bool all_to_all = false;
  bool on() const { return size > 1; }
  int64_t chunk() const { return seq / (2 * size); }
  int64_t local_seq() const { return 2 * chunk(); }
  // Sequence offset of chunk `k` (0 or 1) of cp rank `r`: chunks r and 2c - 1 - r.
  int64_t chunk_offset(int64_t r, int64_t k) const {
    return (k == 0 ? r : 2 * size - 1 - r) * chunk();
  }
  // Sequence position of row `j` of a rank's [2 S / 2c] local rows.
  int64_t position_of(int64_t r, int64_t j) const {
    return chunk_offset(r, j / chunk()) + j % chunk();
  }
};

// Whether a query of chunk [qo, qo + len) may see a key of chunk
// [ko, ko + len) under a layer's mask: conservative (the kernel decides the
// rest tile by tile). With packed documents every document starts with
// global tokens, so anything earlier may be seen.
bool context_chunk_visible(const kernels::AttentionMask& mask, bool documents, int64_t qo,
                           int64_t ko, int64_t len);

// The ring distances t in 1 .. c - 1 at which some rank's queries see a
// chunk of the rank t places before it; each rank receives exactly those
// blocks, straight from (r - t) mod c. Full causal: every t. A sliding
// window within one chunk and no global tokens: 1 and c - 1 (chunk r's
// predecessor lives on rank r - 1, chunk 2c - 1 - r's on rank r + 1). The
// same on every rank.
std::vector<int64_t> context_ring_offsets(const ContextParallel& cp,
                                          const kernels::AttentionMask& mask);

// Throws naming parallel.cp unless S splits into 2c equal chunks.
void check_context_split(const ContextParallel& cp, int64_t seq);

// This rank's rows of a [B, S] (or [B * S]) i32 tensor: [B, 2 S / 2c], its
// two chunks of every sequence side by side.
Tensor context_local_rows(const ContextParallel& cp, const Tensor& full, int64_t batch);

}  // namespace moetron::nn
