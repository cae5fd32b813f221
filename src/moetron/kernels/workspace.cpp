#include "moetron/kernels/workspace.h"

#include "moetron/core/allocator.h"
#include "moetron/core/error.h"

namespace moetron::kernels {

void add_scratch(Scratch& s, int64_t elems, DType dtype, bool per_thread) {
  MOETRON_CHECK(elems >= 0, "add_scratch: negative element count ", elems);
  if (elems > 0) s.push_back({elems, dtype, per_thread});
}

int64_t workspace_bytes(const Scratch& scratch, int64_t threads) {
  MOETRON_CHECK(threads >= 1, "workspace_bytes: threads must be >= 1, got ", threads);
  int64_t total = 0;
  for (const ScratchBuffer& b : scratch) {
    const auto bytes = static_cast<size_t>(b.elems) * dtype_size(b.dtype);
    total += static_cast<int64_t>(Allocator::rounded(bytes)) * (b.per_thread ? threads : 1);
  }
  return total;
}

}  // namespace moetron::kernels
