// Mixture-of-Experts routing: top-k selection, and moving token rows into
// expert-contiguous order and back.
//
// A MoePlan is computed once per step from the router's choice (no data moves)
// and shared by permute, unpermute and their backwards; under expert
// parallelism its per-expert counts are what ranks exchange.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

enum class RouterScore { softmax, sigmoid };

struct RouterArgs {
  int k = 2;
  RouterScore score = RouterScore::softmax;
  bool renormalize = true;  // divide the chosen weights by their sum
};

// logits: [T, E] f32 (reference also f64). bias: [E] f32 or undefined; added to
// the scores for the selection only (aux-loss-free balancing).
// scores: [T, E] = softmax(logits) or sigmoid(logits).
// topk_idx: i32 [T, K], experts by descending selection score, ties to the lower index.
// topk_weight: [T, K] dtype of scores: the chosen scores, renormalised if asked.
MOETRON_KERNEL_DECL(void router_topk(Context& ctx, const Tensor& logits, const Tensor& bias,
                                     const RouterArgs& args, const Tensor& scores,
                                     const Tensor& topk_idx, const Tensor& topk_weight))

// d_logits: [T, E] overwritten = J^T (d_scores_extra + dscores from d_topk_weight),
// through the renormalisation and the softmax/sigmoid. d_scores_extra: [T, E]
// or undefined (e.g. the aux loss's gradient on the scores); d_topk_weight
// may also be undefined (treated as zero). CPU: every tensor f32.
MOETRON_KERNEL_DECL(void router_topk_backward(Context& ctx, const Tensor& d_topk_weight,
                                              const Tensor& d_scores_extra, const Tensor& scores,
                                              const Tensor& topk_idx, const Tensor& topk_weight,
                                              const RouterArgs& args, const Tensor& d_logits))

struct MoePlan {
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t num_experts = 0;
  std::vector<int64_t> offsets;       // E + 1; rows of expert e are [offsets[e], offsets[e+1])
  std::vector<int32_t> token_of_row;  // offsets[E] entries: source token of each permuted row
  std::vector<int32_t> row_of_slot;   // T * K entries: permuted row of (t, k), -1 if dropped
  int64_t dropped = 0;
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
};

// Groups the slots (t, k) by expert, tokens ascending within an expert.
// capacity <= 0 is dropless; otherwise an expert keeps its first `capacity`
// slots in token order and the rest are dropped (counted in `dropped`).
MoePlan moe_plan(const Tensor& topk_idx, int64_t num_experts, int64_t capacity);
// The same with a limit per expert (< 0: none): expert e keeps its first
// limits[e] slots in token order. Expert parallelism uses it so a rank keeps
// exactly the slots one rank holding every token would keep.
MoePlan moe_plan_limited(const Tensor& topk_idx, int64_t num_experts,
                         const std::vector<int64_t>& limits);

// permuted[r] = x[token_of_row[r]] for r < plan.rows(). x: [T, D]; permuted:
// [>= rows, D], same dtype (f32, bf16; reference also f64).
MOETRON_KERNEL_DECL(void moe_permute(Context& ctx, const Tensor& x, const MoePlan& plan,
                                     const Tensor& permuted))
// dx[t] = sum over kept k of d_permuted[row_of_slot[t, k]]; dx [T, D] overwritten.
MOETRON_KERNEL_DECL(void moe_permute_backward(Context& ctx, const Tensor& d_permuted,
                                              const MoePlan& plan, const Tensor& dx))
// out[t] = sum over kept k of topk_weight[t, k] * expert_out[row_of_slot[t, k]];
// out [T, D] overwritten; topk_weight f32 (or f64) [T, K].
MOETRON_KERNEL_DECL(void moe_unpermute(Context& ctx, const Tensor& expert_out, const MoePlan& plan,
                                       const Tensor& topk_weight, const Tensor& out))
// d_expert_out[row_of_slot[t,k]] = topk_weight[t,k] * dout[t] (rows past plan.rows() untouched);
// d_topk_weight[t, k] = dout[t] . expert_out[row] (0 for dropped slots). Both overwritten;
// either may be undefined (skipped). d_expert_out: dtype of expert_out; d_topk_weight: f32 (or
// f64).
MOETRON_KERNEL_DECL(void moe_unpermute_backward(
    Context& ctx, const Tensor& dout, const Tensor& expert_out, const MoePlan& plan,
    const Tensor& topk_weight, const Tensor& d_expert_out, const Tensor& d_topk_weight))

// The combine weights' gradient without the expert outputs (recompute module
// moe_out, nn/recompute.h): d_act[r] comes in as dout[t] W2 (the unweighted
// gradient of row r's SwiGLU output, r = row_of_slot[t, k]) and act[r] is that
// output, so d_topk_weight[t, k] = d_act[r] . act[r] (= dout[t] . expert_out[r],
// as expert_out[r] = act[r] W2^T). Then d_act[r] and d_expert_out[r] (coming in
// as dout[t]; may be undefined) are scaled by topk_weight[t, k] in place: the
// weighted gradients moe_unpermute_backward and the down projection give.
// act, d_act: [>= rows, F], one dtype; d_expert_out: [>= rows, D] of that
// dtype; topk_weight, d_topk_weight: f32 (or f64) [T, K], d_topk_weight
// overwritten (0 for dropped slots).
MOETRON_KERNEL_DECL(void moe_combine_weight_grad(Context& ctx, const Tensor& act,
                                                 const MoePlan& plan, const Tensor& topk_weight,
                                                 const Tensor& d_act, const Tensor& d_expert_out,
                                                 const Tensor& d_topk_weight))

}  // namespace moetron::kernels
