#include "moetron/nn/context_parallel.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::nn {

void check_context_split(const ContextParallel& cp, int64_t seq) {
  MOETRON_CHECK(seq % (2 * cp.size) == 0, "parallel.cp = ", cp.size, ": a sequence of ", seq,
                " tokens does not split into 2 * cp = ", 2 * cp.size,
                " equal chunks (train.seq_len must be a multiple of ", 2 * cp.size, ")");
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
