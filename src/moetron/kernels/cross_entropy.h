// Next-token cross-entropy, plain (on logits) and fused with the LM head so
// the whole batch's fp32 logits never exist at once.
//
// targets: i32 [T]; a target < 0 is ignored (loss 0, no gradient). On a CUDA
// context every tensor, targets included, is a device tensor. The
// gradient is grad_scale * (softmax(logits) - onehot(target)) per token;
// pass grad_scale = 1 / (tokens counted over the whole global batch).
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"
#include "moetron/kernels/workspace.h"

namespace moetron::kernels {

// logits: [T, V] f32 or bf16 (reference also f64); losses: [T] f32 (or f64);
// dlogits: [T, V] dtype of logits, overwritten, may alias logits; an undefined
// Tensor skips the gradient.
MOETRON_KERNEL_DECL_CUDA(void cross_entropy(Context& ctx, const Tensor& logits,
                                            const Tensor& targets, float grad_scale,
                                            const Tensor& losses, const Tensor& dlogits))

// hidden: [T, D], head_w: [V, D] (same dtype, f32 or bf16; reference also f64);
// logits = hidden head_w^T computed chunk_tokens rows at a time (fp32).
// losses: [T] f32 (or f64). d_hidden: [T, D] dtype of hidden, overwritten;
// d_head_w: [V, D] f32 (or f64), accumulated (+=). Undefined gradient tensors
// are skipped (evaluation). CPU, bf16 inputs: d_hidden is computed from the
// chunk's dlogits rounded to bf16, d_head_w from the fp32 dlogits (see
// kernels/cpu/cross_entropy.cpp for the measured trade-off).
MOETRON_KERNEL_DECL(void cross_entropy_fused(Context& ctx, const Tensor& hidden,
                                             const Tensor& head_w, const Tensor& targets,
                                             float grad_scale, int64_t chunk_tokens,
                                             const Tensor& losses, const Tensor& d_hidden,
                                             const Tensor& d_head_w))

// The sizes of one cross_entropy_fused call: hidden [tokens, dim] and head_w
// [vocab, dim] of `dtype`, and which gradients it computes.
struct CrossEntropyFusedShape {
  int64_t tokens = 0, vocab = 0, dim = 0, chunk_tokens = 1;
  DType dtype = DType::f32;
  bool d_hidden = true, d_head_w = true;
};

// The workspace cross_entropy_fused on `backend` allocates for `shape`
// (kernels/workspace.h): on the CPU one chunk of fp32 logits (overwritten by
// the dlogits) and, for bf16, the chunk's bf16 dlogits (with d_hidden) and
// f32 hidden rows (with d_head_w), after, for f16, the staged copies of
// hidden, head_w and d_hidden; nothing on the reference. The CPU matmul's
// fp32 slots persist in the context (kernels/cpu/cpu_state.h): not listed.
Scratch cross_entropy_fused_scratch(Backend backend, const CrossEntropyFusedShape& shape);
namespace cpu {
Scratch cross_entropy_fused_scratch(const CrossEntropyFusedShape& shape);
}  // namespace cpu

}  // namespace moetron::kernels
