// Argument checks shared by the embedding backends (internal to kernels/):
// same rules, same messages, all run before anything is written. The id
// values (no negative id) are each backend's own check: the CPU scans them
// on the host, the CUDA backend on the device.
#pragma once

#include "moetron/kernels/embedding.h"

namespace moetron::kernels::embedding_detail {

// ids i32 [T]; table (or dtable) [V_local, D]; vocab_offset >= 0.
inline void check_ids_shapes(const char* fn, const Tensor& ids, const Tensor& table,
                             const char* table_name, int64_t vocab_offset) {
  MOETRON_CHECK(ids.rank() == 1 && ids.dtype() == DType::i32, fn, ": ids must be i32 [T], got ",
                ids.str());
  MOETRON_CHECK(table.rank() == 2, fn, ": ", table_name, " must be [V_local, D], got ",
                table.str());
  MOETRON_CHECK(vocab_offset >= 0, fn, ": vocab_offset must be >= 0, got ", vocab_offset);
}

}  // namespace moetron::kernels::embedding_detail
