// Next-token cross-entropy, plain (on logits) and fused with the LM head so
// the whole batch's fp32 logits never exist at once.
//
// targets: i32 [T]; a target < 0 is ignored (loss 0, no gradient). The
// gradient is grad_scale * (softmax(logits) - onehot(target)) per token;
// pass grad_scale = 1 / (tokens counted over the whole global batch).
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// logits: [T, V] f32 or bf16 (reference also f64); losses: [T] f32 (or f64);
// dlogits: [T, V] dtype of logits, overwritten, may alias logits; an undefined
// Tensor skips the gradient.
MOETRON_KERNEL_DECL(void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets,
                                       float grad_scale, const Tensor& losses,
                                       const Tensor& dlogits))

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

}  // namespace moetron::kernels
