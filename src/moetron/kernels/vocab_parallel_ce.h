// The numeric steps of a vocabulary-parallel cross-entropy (Megatron), one
// rank's share: the rank holds the fp32 logits of C tokens over its slice
// [offset, offset + V) of the vocabulary. The caller runs them in this order
// with two all-reduces between them (nn/vocab_parallel_ce.cpp):
//   vocab_parallel_ce_max      row maxima of the slice  -> all-reduce max
//   vocab_parallel_ce_exp_sum  exp(logit - max) in place, their sum and the
//                              target's shifted logit   -> all-reduce sum
//   vocab_parallel_ce_loss     losses from the global sums
//   vocab_parallel_ce_grad     the slice's gradient, in place of the exps
// Run on one slice covering the whole vocabulary (offset 0, no all-reduce),
// they compute what kernels::cross_entropy does.
//
// Shapes: logits [C, V]; row_max [C]; stats [C, 2]; targets i32 [C], a
// target < 0 is ignored (loss 0, gradient row 0). CPU: every float tensor
// f32; reference: f32 or f64. Each row is handled by one thread in a fixed
// order, so the results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// row_max[i] = max_j logits[i, j] (overwritten).
MOETRON_KERNEL_DECL(void vocab_parallel_ce_max(Context& ctx, const Tensor& logits,
                                               const Tensor& row_max))

// With row_max the global maxima: logits[i, j] <- exp(logits[i, j] - row_max[i])
// (kept for vocab_parallel_ce_grad); stats[i, 0] = the row's sum of them;
// stats[i, 1] = logits[i, t - offset] - row_max[i] (read before the
// exponentiation) when the target t lies in [offset, offset + V), else 0.
// stats is overwritten, so summing it over the ranks gives the global sum and
// the target's shifted logit.
MOETRON_KERNEL_DECL(void vocab_parallel_ce_exp_sum(Context& ctx, const Tensor& logits,
                                                   const Tensor& row_max, const Tensor& targets,
                                                   int64_t offset, const Tensor& stats))

// With stats summed over the ranks: losses[i] = log(stats[i, 0]) - stats[i, 1],
// 0 for an ignored target. losses: [C], overwritten.
MOETRON_KERNEL_DECL(void vocab_parallel_ce_loss(Context& ctx, const Tensor& stats,
                                                const Tensor& targets, const Tensor& losses))

// exps (vocab_parallel_ce_exp_sum's logits) become the slice's gradient
// grad_scale * (exps / stats[i, 0] - onehot(target - offset)), in place; rows
// of ignored targets become 0.
MOETRON_KERNEL_DECL(void vocab_parallel_ce_grad(Context& ctx, const Tensor& exps,
                                                const Tensor& stats, const Tensor& targets,
                                                int64_t offset, float grad_scale))

}  // namespace moetron::kernels
