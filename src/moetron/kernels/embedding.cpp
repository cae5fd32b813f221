#include "moetron/kernels/embedding.h"

namespace moetron::kernels {

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out,
                       int64_t vocab_offset) {
  MOETRON_KERNEL_DISPATCH(ctx, embedding_forward, ids, table, out, vocab_offset);
}
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_offset) {
  MOETRON_KERNEL_DISPATCH(ctx, embedding_backward, ids, dout, dtable, vocab_offset);
}

}  // namespace moetron::kernels
