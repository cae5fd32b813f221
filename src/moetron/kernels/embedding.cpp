#include "moetron/kernels/embedding.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out,
                       int64_t vocab_offset) {
  if (needs_f16_staging(ctx, {&table, &out})) {
    return run_f16_staged(ctx, "embedding_forward", [&](F16Staging& s) {
      cpu::embedding_forward(ctx, ids, s.in(table), s.out(out), vocab_offset);
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, embedding_forward, ids, table, out, vocab_offset);
}
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_offset) {
  if (needs_f16_staging(ctx, {&dout})) {
    return run_f16_staged(ctx, "embedding_backward", [&](F16Staging& s) {
      cpu::embedding_backward(ctx, ids, s.in(dout), dtable, vocab_offset);
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, embedding_backward, ids, dout, dtable, vocab_offset);
}

Scratch embedding_backward_scratch(Backend backend, int64_t tokens, int64_t rows, int64_t dim,
                                   DType dtype) {
  return call_scratch("embedding_backward_scratch", backend, dtype == DType::f16, {tokens * dim},
                      [&] { return cpu::embedding_backward_scratch(tokens, rows, dim); });
}

}  // namespace moetron::kernels
