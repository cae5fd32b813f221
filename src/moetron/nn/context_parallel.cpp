#include "moetron/nn/context_parallel.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::nn {

void check_context_split(const ContextParallel& cp, int64_t seq) {
  MOETRON_CHECK(seq % (2 * cp.size) == 0, "parallel.cp = ", cp.size, ": a sequence of ", seq,
                " tokens does not split into 2 * cp = ", 2 * cp.size,
                " equal chunks (train.seq_len must be a multiple of ", 2 * cp.size, ")");
}

bool context_chunk_visible(const kernels::AttentionMask& mask, bool documents, int64_t qo,
                           int64_t ko, int64_t len) {
  if (ko > qo) return false;  // causal
  if (mask.window <= 0 || documents || ko < mask.num_global) return true;
  return qo - (ko + len - 1) < mask.window;
}

std::vector<int64_t> context_ring_offsets(const ContextParallel& cp,
                                          const kernels::AttentionMask& mask) {
  std::vector<int64_t> offsets;
  for (int64_t t = 1; t < cp.size; ++t) {
    bool seen = false;
    for (int64_t r = 0; r < cp.size && !seen; ++r) {
      const int64_t owner = (r - t + cp.size) % cp.size;
      for (int64_t kq = 0; kq < 2; ++kq) {
        for (int64_t kk = 0; kk < 2; ++kk) {
          seen = seen || context_chunk_visible(mask, cp.documents, cp.chunk_offset(r, kq),
                                               cp.chunk_offset(owner, kk), cp.chunk());
        }
      }
    }
    if (seen) offsets.push_back(t);
  }
  return offsets;
}

Tensor context_local_rows(const ContextParallel& cp, const Tensor& full, int64_t batch) {
  MOETRON_CHECK(full.dtype() == DType::i32 && full.numel() % batch == 0,
                "context parallelism slices i32 rows, got ", full.str());
  const int64_t seq = full.numel() / batch;
  MOETRON_CHECK(seq == cp.seq, "context parallelism set up for sequences of ", cp.seq,
                " tokens, given ", seq);
  const int64_t c = cp.chunk(), local = cp.local_seq();
  Tensor out = Tensor::empty({batch, local}, DType::i32);
  const int32_t* src = full.data<int32_t>();
  int32_t* dst = out.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t k = 0; k < 2; ++k) {
      const int32_t* from = src + b * seq + cp.chunk_offset(cp.rank, k);
      std::copy(from, from + c, dst + b * local + k * c);
    }
  }
  return out;
}

}  // namespace moetron::nn
