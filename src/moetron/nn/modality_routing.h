// Modality-aware routing for the MoE layer (moe.modality_routing):
//
//   shared       today's router; the token modality only feeds the expert
//                load per modality (and the entropy terms when enabled).
//   prior        a learned modality embedding [M, D] added to the router's
//                input and learned per-modality logit biases [M, E]; both
//                start at 0, so training starts as `shared`.
//   partitioned  MoMa-style: every routed expert is owned by one modality or
//                is shared (owner -1). A token's logits of experts it may not
//                use are -inf before top-k, so its softmax and its top-k run
//                over its modality's experts plus the shared ones only.
//                Owners are global expert ids, so expert parallelism is
//                unaffected.
//
// Balancing, with statistics summed over the balance group (so dp layouts
// equal one rank), for prior and partitioned:
//   Switch aux per modality: aux_coef * sum_m (T_m / T) * E_m *
//     sum_{i allowed to m} f_mi P_mi, f_mi = choices of m's tokens on i /
//     (T_m K), P_mi = mean score of i over m's tokens, E_m = experts allowed
//     to m (this replaces the global Switch loss).
// and, in any mode, LIMoE entropy terms (softmax scores only):
//   local:  local_coef * sum_m mean_{t in m} H(p_t)     (pushed down)
//   global: global_coef * sum_m max(0, threshold - H(mean_{t in m} p_t))
//           (keeps each modality spread over several experts)
// summed over the modalities present in the micro-batch.
//
// Adaptive allocation (partitioned, moe.modality_realloc_every = N > 0):
// every N optimizer steps, from the expert loads per modality summed over
// the window (identical on every rank: the caller sums them over dp) and
// the per-modality losses the trainer reports, each modality's demand per
// owned expert is  q_m = loss_m * tokenshare_m / owned_m.  Let
// Phi = max_m q_m / min_m q_m over modalities with tokens. One expert moves
// from the modality with the lowest q to the one with the highest only if
// (a) the donor keeps >= moe.modality_min_experts experts and (b) the move
// lowers Phi by at least the factor (1 + moe.modality_realloc_hysteresis).
// The expert moved is the donor's least-loaded one in the window (lowest id
// on ties). Phi strictly falls with every move under constant inputs and is
// bounded below by 1, so the allocation settles and never oscillates.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/moe.h"

namespace moetron::nn {

enum class ModalityRouting { shared, prior, partitioned };

// "shared" | "prior" | "partitioned"; else an Error naming moe.modality_routing.
ModalityRouting parse_modality_routing(const std::string& name);

// moe.modality_experts "4,2,2": experts owned by modalities 0, 1, 2 (in
// that order, contiguous from expert 0); the remaining experts are shared.
// Empty: E / M each (the remainder shared). Returns owner per expert (-1:
// shared). Errors name moe.modality_experts.
std::vector<int32_t> initial_expert_owners(const std::string& spec, int64_t num_modalities,
                                           int64_t num_experts, int64_t top_k);

// Experts modality m may use (owner m or shared).
int64_t allowed_experts(const std::vector<int32_t>& owner, int32_t m);

// Partitioned top-k: sets logits of disallowed experts to -inf, runs
// router_topk per modality with the selection bias (or 0) and -inf on the
// disallowed experts, and writes scores (exactly 0 where disallowed),
// topk_idx (global ids) and topk_weight. modality: i32 [T] or undefined
// (every token 0). logits/scores/topk_weight in the accumulation dtype.
void partitioned_router_topk(kernels::Context& ctx, const Tensor& logits, const Tensor& bias,
                             const kernels::RouterArgs& args, const Tensor& modality,
                             int64_t num_modalities, const std::vector<int32_t>& owner,
                             const Tensor& scores, const Tensor& topk_idx,
                             const Tensor& topk_weight);

struct ModalityLossConfig {
  double aux_coef = 0;  // per-modality Switch (0: off)
  double local_entropy_coef = 0;
  double global_entropy_coef = 0;
  double global_entropy_threshold = 0;  // nats
};

// Per-modality sums of one micro-batch ([M] and [M, E] row-major).
struct ModalitySums {
  int64_t num_modalities = 0, num_experts = 0;
  std::vector<double> tokens, counts, score_sums, entropy_sums;
};

// This rank's sums: scores [T, E] (f32 or f64), topk_idx i32 [T, K],
// modality i32 [T] or undefined.
ModalitySums local_modality_sums(const Tensor& scores, const Tensor& topk_idx,
                                 const Tensor& modality, int64_t num_modalities);
// Sums over `group` (nullptr or size 1: unchanged). One f64 allreduce.
void reduce_modality_sums(comm::Communicator* group, ModalitySums& sums);

struct ModalityLossValues {
  double aux = 0;      // coefficient applied
  double entropy = 0;  // local + global terms, coefficients applied
};
// owner: [E] owners (all -1 outside partitioned mode).
ModalityLossValues modality_loss_values(const ModalitySums& sums, const std::vector<int32_t>& owner,
                                        int64_t top_k, const ModalityLossConfig& cfg);
// d_scores [T, E] += weight * d(aux + entropy)/d scores on this rank's tokens.
void add_modality_loss_gradients(const Tensor& scores, const Tensor& modality,
                                 const ModalitySums& sums, const std::vector<int32_t>& owner,
                                 int64_t top_k, const ModalityLossConfig& cfg, double weight,
                                 const Tensor& d_scores);

// Per-token modality ids (undefined tensor: all 0), checked to be in [0, M).
std::vector<int32_t> modality_ids(const Tensor& modality, int64_t tokens, int64_t num_modalities);

struct AllocationRule {
  int64_t min_experts = 1;
  double hysteresis = 0.1;
  int64_t top_k = 1;  // a donor keeps at least top_k usable experts (own + shared)
};
struct AllocationMove {
  bool moved = false;
  int64_t expert = -1;
  int32_t from = -1, to = -1;
  double phi_before = 0, phi_after = 0;
};
// The rule of the header comment. load: [M, E] row-major window counts;
// loss: [M] per-modality losses (empty: all 1). Changes `owner` at most by
// one expert.
AllocationMove adapt_allocation(std::vector<int32_t>& owner, std::span<const double> load,
                                std::span<const double> loss, int64_t num_modalities,
                                const AllocationRule& rule);

}  // namespace moetron::nn
