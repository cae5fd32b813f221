// Token embedding gather and its scatter-add backward. vocab_offset lets a
// rank hold rows [vocab_offset, vocab_offset + V_local) of a vocab-parallel table.
// On a CUDA context every tensor, ids included, is a device tensor; the ids
// are checked on the device and read back (one synchronisation per call).
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"
#include "moetron/kernels/workspace.h"

namespace moetron::kernels {

// ids: i32 [T] (negative ids are an error); table: [V_local, D]; out: [T, D]
// same dtype as table (f32 or bf16; reference also f64). A row whose id is
// outside the local range is zero.
MOETRON_KERNEL_DECL_CUDA(void embedding_forward(Context& ctx, const Tensor& ids,
                                                const Tensor& table, const Tensor& out,
                                                int64_t vocab_offset))
// dtable: [V_local, D] f32 (or f64), accumulated: dtable[id - offset] += dout[t].
// Deterministic: each row's contributions are summed in token order.
MOETRON_KERNEL_DECL_CUDA(void embedding_backward(Context& ctx, const Tensor& ids,
                                                 const Tensor& dout, const Tensor& dtable,
                                                 int64_t vocab_offset))

// The workspace embedding_backward on `backend` allocates for `tokens` ids,
// a [rows, dim] table and dout of `dtype` (kernels/workspace.h): on the CPU
// the counting sort's row starts, token order and fill cursors, after, for
// f16, the staged copy of dout; nothing on the reference.
Scratch embedding_backward_scratch(Backend backend, int64_t tokens, int64_t rows, int64_t dim,
                                   DType dtype);
namespace cpu {
Scratch embedding_backward_scratch(int64_t tokens, int64_t rows, int64_t dim);
}  // namespace cpu

}  // namespace moetron::kernels
