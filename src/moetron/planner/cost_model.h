// The step-time cost model: what one training step of a layout costs on a
// hardware profile (planner/hardware_profile.h), term by term, so a plan can
// say which term dominates. Analytic, and cheap enough to evaluate every
// layout of a 1024-device cluster.
//
// Per device, with T tokens per step over W = dp tp pp cp devices:
//   compute     T x training FLOPs per token (nn/flops.h; + a forward of
//               what the recompute policy rebuilds) / W at peak x
//               efficiency (GEMMs and attention apart; a GEMM of m rows at
//               gemm_efficiency x m / (m + gemm_half_rows), the experts'
//               grouped ones at grouped_gemm_efficiency instead); the experts' share
//               scaled by (1 + routing skew) under ep (the busiest rank sets
//               the pace)
//   pipeline    the schedule's bubble, from an event simulation of the 1F1B
//               (interleaved with vpp > 1) schedule the trainer runs
//               (parallel::simulate_schedule: backward twice a forward),
//               as a share of everything the forwards and backwards run
//               (pipelined_seconds), plus the stage-to-stage activations
//   tp          4 all-reduces (or all-gather + reduce-scatter with sequence
//               parallelism: the same bytes) of a micro-batch's activations
//               per layer, ring algorithm; 2-D (q x q, nn/tensor_parallel_2d.h):
//               along rows the same on 1/q of the micro-batch over q
//               ranks, along columns each tp block of a matrix gathered
//               before its forward and its backward and its gradient
//               reduce-scattered, (q - 1) / q of the block each
//   ep          4 all-to-alls of the routed tokens (top_k copies) per MoE layer
//   cp          the K/V ring of each attention layer, hidden under the
//               attention it overlaps
//   dp          the gradients' ring all-reduce (reduce-scatter + all-gather
//               of bf16 weights under ZeRO-1), hidden under the last
//               micro-batch's backward where it fits
//   elementwise the memory-bound work between the GEMMs (norms, residual
//               adds, RoPE, the SwiGLU gate, the router's softmax; the
//               cross-entropy over the vocabulary, tp-sharded): bytes read
//               and written per token, forward and backward / the rate the
//               elementwise kernels reach (elementwise_bandwidth)
//   optimizer   the bytes the update reads and writes / memory bandwidth
//               (offload: / the host's, plus the gradients down and the
//               weights up over PCIe, not overlapped)
//   zero3       per micro-batch, the weights' all-gather for forward and
//               for backward and the gradients' reduce-scatter, hidden
//               under that micro-batch's compute where it fits (dp term)
// Each collective's time is latency x steps + bytes on the wire / bandwidth
// of its link class: within a node when the group fits in one (ranks are
// numbered tp fastest, then cp, dp, pp), else between nodes.
//
// Memory per device: bf16 weights, fp32 masters, fp32 gradients, AdamW's
// two fp32 moments (the last three split over dp under ZeRO-1; all four
// under ZeRO-3, plus two layers' gathered weights; masters and moments in
// host memory under offload, bf16 gradients on the device), and the
// activations 1F1B keeps in flight (pp micro-batches on the first stage)
// from a per-token count per layer (recompute full keeps only each layer's
// input). It is the planner's quick estimate; planner/memory_model.h is the
// byte-exact one for a plan that runs here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "moetron/nn/model_config.h"
#include "moetron/planner/hardware_profile.h"

namespace moetron::planner {

struct LayoutChoice {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, cp = 1, vpp = 1;
  int64_t micro_batch = 1;         // sequences per micro-batch per dp rank
  std::string recompute = "none";  // none | selective | full
  bool zero1 = false;
  // Planner-only (the runtime has neither yet): ZeRO-3 also shards the bf16
  // weights and the gradients over dp, gathering each layer's weights for
  // its forward and backward (implies zero1); offload keeps the fp32
  // masters and moments in host memory and runs the optimizer on the CPU
  // (ZeRO-Offload), gradients and weights crossing PCIe every step.
  bool zero3 = false;
  bool offload = false;
  // 2-D tensor parallelism (parallel.tp_2d = "qxq", tp = q^2; rows within
  // a node, columns across): SUMMA's traffic, activations along rows and
  // weight blocks along columns (the runtime's parallel.tp_2d).
  bool tp_2d = false;
  bool sequence_parallel = true;  // with tp > 1
  int64_t world() const { return dp * tp * pp * cp; }
  bool beyond_runtime() const { return zero3 || offload; }
  std::string str() const;  // "dp=16,tp=8,pp=8,ep=8,cp=1,vpp=1,mb=1,recompute=none,zero1"
};

struct Workload {
  nn::ModelConfig model;
  nn::MoeConfig moe;
  int64_t seq_len = 4096;
  int64_t global_batch = 1024;  // sequences per step
  double routing_skew = 0.1;    // the busiest expert rank's extra load (0: balanced)
  // Whether the dp reduction runs under the last micro-batch's backward
  // (false: all of it after the pipeline, as a trainer without overlap).
  bool dp_overlap = true;
};

struct StepCost {
  double compute_s = 0, bubble_s = 0, pp_comm_s = 0, tp_comm_s = 0, ep_comm_s = 0, cp_comm_s = 0,
         dp_comm_s = 0, optimizer_s = 0, elementwise_s = 0;
  double step_s = 0;
  // The whole dp reduction (dp_comm_s is what the last backward leaves of it).
  double dp_reduce_s = 0;
  double tokens_per_s = 0, mfu = 0, tflops_per_device = 0;
  double memory_bytes = 0;  // per device, the largest stage's
  double host_bytes = 0;    // per device, in host memory (offload)
  // Bytes each device puts on the wire per step, by axis.
  double tp_bytes = 0, ep_bytes = 0, cp_bytes = 0, dp_bytes = 0, pp_bytes = 0;
  // 2-D tp: of tp_bytes, the weight blocks moved along the grid's columns
  // (the rest are activations along its rows).
  double tp_weight_bytes = 0;
  // The term that costs most ("compute", "dp", "tp", ...).
  std::string dominant() const;
};

// q when tp = q x q, else 0.
int64_t grid_side(int64_t tp);

// Ring collectives over n ranks of `bytes` each on link l: all-reduce
// (2 (n - 1) steps), and all-gather or reduce-scatter (half of it).
double allreduce_seconds(double bytes, int64_t n, const Link& l);
double allgather_seconds(double bytes, int64_t n, const Link& l);

// What a step's forwards and backwards run, split evenly over them (the
// pipeline's ops): compute, elementwise and the exposed tp, ep, cp and pp
// communication. The bubble idles this; dp and the optimizer come after.
double pipelined_seconds(const StepCost& c);

// A workload on a hardware profile; what depends only on them (FLOPs and
// parameters per token and layer) is computed once, so a search can
// evaluate thousands of layouts.
class CostModel {
 public:
  CostModel(Workload w, HardwareProfile hw);
  // Empty when the layout fits the workload, else why not (heads by tp,
  // experts by ep and ep by the stage's ranks, layers by pp x vpp, the
  // global batch by dp x micro_batch, the sequence by cp).
  std::string misfit(const LayoutChoice& l) const;
  // Throws with misfit()'s reason when the layout does not fit.
  StepCost predict(const LayoutChoice& l) const;
  // predict() without the check, for a search that has just asked misfit()
  // (its hot loop would otherwise check every layout twice).
  StepCost estimate(const LayoutChoice& l) const;
  // FLOP/s of a GEMM of `rows` rows on this device (the experts' grouped
  // ones at grouped_gemm_efficiency).
  double gemm_rate(double rows, bool grouped = false) const;
  const Workload& workload() const { return w_; }
  const HardwareProfile& hardware() const { return hw_; }
  double dense_params() const { return dense_params_; }
  double expert_params() const { return expert_params_; }
  // The link a group of `group` ranks `stride` apart talks over: within a
  // node when they fit in one (nodes hold consecutive ranks), else between.
  const Link& link(int64_t group, int64_t stride) const;

 private:
  // The parameters a device holds (dense split over tp x pp, experts over
  // ep x pp), the groups that reduce their gradients, and the shards ZeRO
  // splits their state into (1 without it).
  struct LocalParams {
    double dense = 0, experts = 0, dense_shards = 1, expert_shards = 1;
    int64_t dense_group = 1, expert_group = 1;
    double whole() const { return dense + experts; }
    double sharded() const { return dense / dense_shards + experts / expert_shards; }
  };
  LocalParams local_params(const LayoutChoice& l) const;
  double compute_seconds(const LayoutChoice& l) const;
  void add_communication(const LayoutChoice& l, StepCost& c) const;
  void add_dp_communication(const LayoutChoice& l, StepCost& c) const;
  void add_tp_2d_communication(const LayoutChoice& l, StepCost& c) const;
  double memory_per_device(const LayoutChoice& l) const;
  // Idle time over busy time of a pp x vpp schedule of m micro-batches
  // (simulated once per shape).
  double bubble_ratio(int64_t pp, int64_t microbatches, int64_t vpp) const;

  Workload w_;
  HardwareProfile hw_;
  int64_t moe_layers_ = 0;
  double flops_per_token_ = 0;  // the MFU numerator (nn/flops.h)
  double attention_flops_ = 0, expert_flops_ = 0, dense_flops_ = 0;  // per token, training
  double qkv_forward_flops_ = 0;  // per token, one forward of the q, k, v projections
  double dense_params_ = 0, expert_params_ = 0;
  double activation_bytes_ = 0;   // per token per layer (bf16, before tp), averaged over layers
  double elementwise_bytes_ = 0;  // per token, all layers (before tp), forward and backward
  double loss_bytes_ = 0;         // per token: the cross-entropy's logits (before tp)
  mutable std::map<std::tuple<int64_t, int64_t, int64_t>, double> bubbles_;
};

// "tp=8,pp=8,dp=16,ep=8,cp=1,vpp=1,mb=1,recompute=full,zero1" (the form
// LayoutChoice::str() writes): unnamed degrees are 1, dp defaults to what
// the others leave of `devices`. Throws naming the bad item.
LayoutChoice parse_layout(const std::string& text, int64_t devices);
// The non-empty comma-separated items of a layout text ("tp=8,pp=8,zero1").
std::vector<std::string> layout_items(const std::string& text);

// The bytes a plan may fill per device: 90% of its memory (headroom for the
// allocator's rounding and the workspace the estimate leaves out).
double memory_budget(const HardwareProfile& hw);
// Whether a plan's memory fits the device's budget (and, offloaded, the
// host's share of its memory per device).
bool fits_memory(const StepCost& c, const HardwareProfile& hw);

}  // namespace moetron::planner
