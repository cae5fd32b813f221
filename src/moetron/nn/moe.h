// Routed Mixture-of-Experts feed-forward with optional shared experts.
//
// router (fp32 / accum dtype) -> top-k -> plan -> permute -> grouped GEMM
// gate-up -> SwiGLU -> grouped GEMM down -> weighted unpermute-combine.
// Balancing: Switch aux loss and router z-loss (each with its coefficient,
// 0 = off) and DeepSeek-V3 aux-loss-free selection biases updated once per
// optimizer step from the step's expert loads.
//
// Saves for backward: x (and its accum-dtype copy for the router), router
// scores, top-k indices and weights, the plan, the permuted input, the
// gate-up product, the SwiGLU output and the expert outputs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/moe.h"
#include "moetron/nn/mlp.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter.h"

namespace moetron::nn {

struct BalanceSums;

struct MoeStats {
  double aux_loss = 0;  // unweighted value for this micro-batch (coefficient applied)
  double z_loss = 0;
  int64_t dropped = 0;
};

class MoeLayer {
 public:
  MoeLayer(const ModelConfig& model, const MoeConfig& moe, const std::string& prefix,
           Precision prec, ParameterSet& params);

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
  // "model.layers.{i}." of the block holding this layer.
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  int64_t d_, e_, k_, f_;
  double aux_coef_, z_coef_, capacity_factor_;
  bool use_bias_;
  kernels::RouterArgs router_args_;
  Precision prec_;
  Parameter* router_;
  Tensor w13_, w13_grad_;  // [E, 2F, D]
  Tensor w2_, w2_grad_;    // [E, D, F]
  Tensor bias_;            // [E] accum dtype, selection only
  std::unique_ptr<SwiGluMlp> shared_;
  std::vector<int64_t> load_;
  comm::Communicator* balance_group_ = nullptr;
  struct Saved {
    Tensor x, x_router, scores, topk_idx, topk_weight, logits;
    kernels::MoePlan plan;
    Tensor permuted, gate_up, act, expert_out;
    double loss_weight = 0;
    std::shared_ptr<const BalanceSums> balance;  // global sums of this forward
  } saved_;
};

}  // namespace moetron::nn
