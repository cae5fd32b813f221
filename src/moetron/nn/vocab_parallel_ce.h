// Vocabulary-parallel LM head and cross-entropy (Megatron): each tp rank
// holds rows [rank * V / tp, (rank + 1) * V / tp) of the head and computes
// only those logits; per token the row max and the sum of exponentials are
// all-reduced over tp (a max, then one sum carrying the target's logit), so
// the full [T, V] logits exist nowhere. The GEMMs and the all-reduces are
// here, the softmax steps between them in kernels/vocab_parallel_ce.h.
// Processed chunk_tokens rows at a time, like kernels::cross_entropy_fused,
// whose contract it follows:
// losses [T] f32 (every tp rank gets them all); d_hidden [T, D] overwritten
// with this rank's partial sum of the gradient (the caller sums it over tp);
// d_head_w [V / tp, D] accumulated. fp32 statistics; hidden f32 or bf16.
#pragma once

#include "moetron/kernels/context.h"
#include "moetron/nn/tensor_parallel.h"

namespace moetron::nn {

void vocab_parallel_cross_entropy(kernels::Context& ctx, const TensorParallel& tp,
                                  const Tensor& hidden, const Tensor& head_w, const Tensor& targets,
                                  float grad_scale, int64_t chunk_tokens, const Tensor& losses,
                                  const Tensor& d_hidden, const Tensor& d_head_w);

}  // namespace moetron::nn
