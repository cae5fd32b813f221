// Routed Mixture-of-Experts feed-forward with optional shared experts.
//
// router (fp32 / accum dtype) -> top-k -> plan -> permute -> grouped GEMM
// gate-up -> SwiGLU -> grouped GEMM down -> weighted unpermute-combine.
// Balancing: Switch aux loss and router z-loss (each with its coefficient,
// 0 = off) and DeepSeek-V3 aux-loss-free selection biases updated once per
// optimizer step from the step's expert loads.
//
// Modality-aware routing (moe.modality_routing, nn/modality_routing.h):
// set_token_modality gives each token a modality before forward; prior adds
// learned modality terms to the router, partitioned restricts each token to
// its modality's experts plus the shared ones, with per-modality balancing,
// LIMoE entropy terms and an adaptive expert allocation. Without a token
// modality every token is modality 0 and `shared` is exactly today's layer.
//
// Saves for backward: x (and its accum-dtype copy for the router), router
// scores, top-k indices and weights, the plan, the permuted input, the
// gate-up product, the SwiGLU output and the expert outputs. Recomputation
// (nn/recompute.h, moe_recompute.cpp): moe_act drops the SwiGLU outputs,
// moe_dispatch the permuted input and the router's input copy, moe_out the
// expert outputs (one rank holding every expert: backward forms the combine
// weights' gradient from the down projection's input side instead), norm the
// input x (handed back by the block through restore_input before backward).
// Backward frees the SwiGLU outputs once the down projection's weight
// gradient is formed and writes the gate-up gradient over the gate-up product.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/moe.h"
#include "moetron/nn/mlp.h"
#include "moetron/nn/modality_routing.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter.h"

namespace moetron::nn {

struct BalanceSums;

struct MoeStats {
  double aux_loss = 0;  // unweighted value for this micro-batch (coefficient applied)
  double z_loss = 0;
  double entropy_loss = 0;  // LIMoE entropy terms (coefficients applied); 0 when off
  int64_t dropped = 0;
};

class MoeLayer {
 public:
  MoeLayer(const ModelConfig& model, const MoeConfig& moe, const std::string& prefix,
           Precision prec, ParameterSet& params, ExpertParallel ep = {});

  // x, y: [T, D]; y overwritten. loss_weight scales the balancing losses'
  // gradients (the micro-batch's share of the step's tokens).
  MoeStats forward(kernels::Context& ctx, const Tensor& x, const Tensor& y, double loss_weight);
  void backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx);
  void release();

  // Tokens routed to each expert since the last reset (pre-drop choices).
  const std::vector<int64_t>& expert_load() const { return load_; }
  void reset_load();
  // Aux-loss-free balancing: b_i -= rate if expert i is above the mean load,
  // += rate if below; then resets the load counters.
  void update_bias(double rate);
  const Tensor& bias() const { return bias_; }
  // Tokens per expert summed over ranks by the caller (data parallelism).
  void set_expert_load(std::vector<int64_t> load);
  // The ranks that together hold one micro-batch (dp): the balancing losses
  // and their gradients use statistics summed over them, so they equal one
  // rank's. nullptr: this rank's tokens only (evaluation).
  void set_balance_group(comm::Communicator* group) { balance_group_ = group; }
  // Expert parallelism (moe_dispatch.cpp): the ep ranks that together hold
  // every expert once, this one holding experts [first_expert(),
  // first_expert() + local_experts()). Each rank routes its own tokens; the
  // slots go to their expert's rank by all-to-all and come back the same way.
  void set_expert_group(comm::Communicator* group);
  int64_t local_experts() const { return e_local_; }
  int64_t first_expert() const { return e_first_; }
  // Modality-aware routing (nn/modality_routing.h). The modality of each
  // token of the next forward: i32 [T] in [0, num_modalities()), kept for
  // its backward and recompute; undefined: every token is modality 0. It
  // stays set until changed: a checkpointed block's second forward must see
  // the same modality as its first (set it again per micro-batch).
  void set_token_modality(Tensor modality) { modality_ = std::move(modality); }
  ModalityRouting modality_routing() const { return routing_; }
  int64_t num_modalities() const { return num_modalities_; }
  // Routed choices per (modality, expert) since the last reset_load(): [M][E].
  std::vector<std::vector<int64_t>> expert_load_by_modality() const;
  // The same summed over ranks by the caller (data parallelism), row-major [M * E].
  const std::vector<int64_t>& expert_load_by_modality_flat() const { return modality_load_; }
  void set_expert_load_by_modality(std::vector<int64_t> flat);
  // partitioned: owner of each routed expert (a modality, or -1: shared).
  // Other modes: all -1.
  const std::vector<int32_t>& expert_owners() const { return owner_; }
  void set_expert_owners(std::vector<int32_t> owner);
  // Once per optimizer step, before update_bias/reset_load, with the step's
  // loads summed over dp (set_expert_load_by_modality) and the per-modality
  // mean losses (empty: all 1): adds them to the allocation window and,
  // every moe.modality_realloc_every calls, applies the rule of
  // modality_routing.h (partitioned only). Returns the move (for the log).
  AllocationMove update_allocation(std::span<const double> modality_loss);
  // Owners, window and call count as doubles for a checkpoint.
  std::vector<double> allocation_state() const;
  void set_allocation_state(std::span<const double> state);
  // "model.layers.{i}." of the block holding this layer.
  const std::string& prefix() const { return prefix_; }

  // Recomputation (moe_recompute.cpp).
  void set_recompute(bool drop_act, bool drop_dispatch, bool drop_out = false);
  void drop_input();
  void restore_input(const Tensor& x);
  // In a checkpointed block, forward keeps its routing (top-k indices, i32
  // [T, K]); the recompute pass (set around the block's second forward)
  // counts no expert load and checks that it routed every token exactly as
  // the first forward did (a moetron::Error naming the layer otherwise).
  void set_keep_routing(bool keep) { keep_routing_ = keep; }
  void set_recompute_pass(bool on) { recompute_pass_ = on; }
  int64_t routing_checks() const { return routing_checks_; }
  // The routing a checkpointed forward recorded, moved out and back in
  // (pipeline stages keep one per micro-batch in flight).
  Tensor take_routing_record() { return std::exchange(routing_record_, Tensor()); }
  void put_routing_record(Tensor record) { routing_record_ = std::move(record); }

 private:
  std::string prefix_;
  int64_t d_, e_, k_, f_;
  int64_t ep_size_ = 1, e_local_ = 0, e_first_ = 0;
  comm::Communicator* ep_group_ = nullptr;
  double aux_coef_, z_coef_, capacity_factor_;
  bool use_bias_;
  kernels::RouterArgs router_args_;
  ModalityRouting routing_ = ModalityRouting::shared;
  int64_t num_modalities_ = 1;
  ModalityLossConfig modality_losses_;
  bool modality_losses_on_ = false;
  std::vector<int32_t> owner_;                     // [E]
  std::vector<int64_t> modality_load_;             // [M * E]
  std::vector<double> window_load_, window_loss_;  // [M * E], [M]
  int64_t window_steps_ = 0, realloc_every_ = 0;
  AllocationRule alloc_rule_;
  Tensor modality_;                      // for the next forward
  Parameter* modality_embed_ = nullptr;  // prior: [M, D]
  Parameter* modality_bias_ = nullptr;   // prior: [M, E]
  void setup_modality_routing(const MoeConfig& moe, ParameterSet& params);
  Tensor router_input(kernels::Context& ctx, const Tensor& x, const Tensor& modality);
  void route(kernels::Context& ctx);
  // Adds this forward's routed slots to the per-modality loads (`counts`:
  // its slots per expert, all tokens).
  void count_modality_load(const std::vector<int64_t>& counts);
  void modality_backward(const Tensor& d_logits, const Tensor& dx_router);
  Precision prec_;
  Parameter* router_;
  Tensor w13_, w13_grad_;  // [local experts, 2F, D]
  Tensor w2_, w2_grad_;    // [local experts, D, F]
  Tensor bias_;            // [E] accum dtype, selection only
  std::unique_ptr<SwiGluMlp> shared_;
  std::vector<int64_t> load_;
  comm::Communicator* balance_group_ = nullptr;
  bool drop_act_ = false, drop_dispatch_ = false, drop_out_ = false;
  bool keep_routing_ = false, recompute_pass_ = false;
  Tensor routing_record_;
  int64_t routing_checks_ = 0;
  void record_routing(const Tensor& topk_idx);
  void drop_after_forward();
  void rebuild_act(kernels::Context& ctx);
  void rebuild_permuted(kernels::Context& ctx);
  void rebuild_router_input(kernels::Context& ctx);
  // Expert parallelism (moe_dispatch.cpp).
  void plan_expert_parallel(const std::vector<int64_t>& counts, int64_t tokens);
  Tensor to_experts(kernels::Context& ctx, const Tensor& local_rows);
  Tensor from_experts(kernels::Context& ctx, const Tensor& expert_rows);
  Tensor dispatch(kernels::Context& ctx, const Tensor& x);
  const std::vector<int64_t>& expert_offsets() const;

 public:
  // What forward saved for backward. Pipeline parallelism keeps several
  // micro-batches in flight and swaps each one's in and out.
  struct Saved {
    Tensor x, x_router, scores, topk_idx, topk_weight, logits;
    Tensor modality;  // i32 [T] or undefined (all 0)
    // plan: this rank's slots (over all E experts). Under expert
    // parallelism `exchange` maps the rows received from the ep ranks
    // (source-rank major) to expert-major rows of the local experts, and
    // permuted / gate_up / act hold those rows while expert_out holds the
    // outputs returned to this rank's slots (plan order).
    kernels::MoePlan plan, exchange;
    std::vector<int64_t> send_rows, recv_rows;
    Tensor permuted, gate_up, act, expert_out;
    double loss_weight = 0;
    std::shared_ptr<const BalanceSums> balance;         // global sums of this forward
    std::shared_ptr<const ModalitySums> modality_sums;  // the same per modality
    SwiGluMlp::Saved shared;  // the shared experts' (kept in shared_ between swaps)
  };
  void swap_saved(Saved& other) {
    std::swap(saved_, other);
    if (!shared_) return;
    shared_->swap_saved(saved_.shared);      // the incoming state's into the MLP
    std::swap(saved_.shared, other.shared);  // the outgoing MLP state into `other`
  }

 private:
  Saved saved_;
};

}  // namespace moetron::nn
