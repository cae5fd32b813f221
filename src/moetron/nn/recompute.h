// Activation recomputation: which saved tensors the modules drop after their
// forward and rebuild in backward, and how many consecutive blocks share one
// checkpoint (only the segment's input is kept; backward runs the segment's
// forward again before its backward).
//
// Policies (config `recompute.policy`):
//   none       keep everything each module saves (see the module headers)
//   selective  drop moe_act, norm, moe_dispatch, moe_out, attn_q, attn_kv
//              (below): the memory-bound rebuilds, the expert outputs
//              (rebuilt by nothing) and the attention's D-deep projections;
//              the attention core (S-deep), the residual and the experts'
//              gate-up product stay
//   full       keep each block's input only (segments of 1 block)
//   sqrt       keep the input of every k-th block, k = ceil(sqrt(L))
//   custom     drop exactly the modules listed in `recompute.modules`
// The last segment is never recomputed: backward needs it first, so keeping
// it costs no more peak memory than rebuilding it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace moetron::nn {

// What a module may drop (bit flags of RecomputePolicy::modules).
enum class Recompute : uint32_t {
  // Attention output before o_proj: rebuilt by the attention forward from the
  // saved q, k, v (the log-sum-exp stays saved).
  attn_core = 1,
  // SwiGLU outputs (routed experts, shared experts, dense FFN): rebuilt from
  // the saved gate-up product.
  moe_act = 2,
  // The two RMSNorm outputs of a block (the inputs of q/k/v and of the FFN):
  // rebuilt from the block input and the attention residual.
  norm = 4,
  // MoE permutation buffers: the expert-ordered copy of the input (a gather)
  // and the router's accumulation-dtype copy of the input (a conversion).
  moe_dispatch = 8,
  // The routed experts' outputs [T K, D]: nothing is rebuilt; backward forms
  // the combine weights' gradient as d_act . act (kernels/moe.h). One rank
  // holding every expert only (under ep the outputs stay).
  moe_out = 16,
  // q (after RoPE): projected again from the attention input.
  attn_q = 32,
  // k (after RoPE) and v: projected again from the attention input.
  attn_kv = 64,
  // The attention residual h = x + o_proj(attention output), input of the
  // FFN's norm: o_proj runs again (tp 1 only; under tp h stays).
  attn_residual = 128,
};

struct RecomputePolicy {
  std::string name = "none";
  uint32_t modules = 0;  // Recompute flags
  int64_t segment = 0;   // blocks per checkpointed segment; 0: no checkpointing
  bool drops(Recompute m) const { return (modules & static_cast<uint32_t>(m)) != 0; }
};

// Every module name accepted in `recompute.modules`, in flag order.
const std::vector<std::string>& recompute_module_names();
// policy: none | selective | full | sqrt | custom; `modules` only with custom
// (and required there). segment > 0 overrides sqrt's k. Errors name the
// config key (recompute.policy, recompute.modules, recompute.segment).
RecomputePolicy make_recompute_policy(const std::string& policy,
                                      const std::vector<std::string>& modules, int64_t n_layers,
                                      int64_t segment = 0);
// "sqrt (segments of 3 blocks)", "custom [norm, moe_act]".
std::string describe(const RecomputePolicy& p);

// Wall seconds this process spent rebuilding dropped activations (every
// rebuild, a checkpointed segment's second forward, and moe_out's weight
// gradient kernel) since the last reset: the measured price of a policy,
// free of the step-to-step noise a difference of step times carries.
double recompute_seconds();
void reset_recompute_seconds();
// Times its scope into recompute_seconds(); nested scopes count once.
class RecomputeTimer {
 public:
  RecomputeTimer();
  ~RecomputeTimer();
  RecomputeTimer(const RecomputeTimer&) = delete;
  RecomputeTimer& operator=(const RecomputeTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  bool outer_;
};

}  // namespace moetron::nn
