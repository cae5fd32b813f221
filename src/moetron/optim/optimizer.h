// The single-process optimizer over a ParameterSet: fp32 master weights
// (the parameter itself when its working copy is already in the master
// dtype), global grad-norm clipping, and per-parameter rules: Muon for 2-D
// hidden matrices (each expert matrix and q/k/v separately) when
// name = "muon", AdamW for the rest (embeddings, head, norms, router).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "moetron/core/tensor.h"
#include "moetron/kernels/adamw.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/quantized_state.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/tensor_parallel.h"
#include "moetron/optim/lr_schedule.h"

namespace moetron::optim {

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | muon
  double weight_decay = 0.1;   // decoupled; applied to matrices (rank >= 2) only
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // 0: off
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
  // Storage of AdamW's exp_avg / exp_avg_sq and Muon's momentum: f32, or
  // bf16 (half the optimizer memory of the moments; loaded into fp32,
  // updated in fp32, stored rounded to nearest even once per step), or u8:
  // 8-bit codes with an fp32 scale per 256 values (kernels/quantized_state.h;
  // AdamW's second moment kept as sqrt(v)), stochastically rounded with
  // keys from rounding_seed. fp64 (gradient-check) runs keep f64.
  DType moment_dtype = DType::f32;
  // With u8 moments: AdamW's second moment of each matrix factored into row
  // and column averages (Adafactor; kernels/quantized_state.h), rows + cols
  // fp32 values instead of one code per element. Vectors keep 8-bit codes.
  bool factored_second_moment = false;
  // Master weights of the parameters whose working copy is bf16: f32 (a
  // separate fp32 copy, 4 bytes per parameter), or bf16 (the working copy
  // is the master: updated in fp32 and stored with stochastic rounding,
  // kernels/stochastic_round.h, whose bits are keyed by rounding_seed, the
  // parameter's name and the step). fp32 parameters keep fp32 masters.
  DType master_dtype = DType::f32;
  uint64_t rounding_seed = 0;
  // Parameter groups by name (glob patterns, fnmatch syntax): parameters
  // matching `adamw_patterns` stay on AdamW even when Muon would take them;
  // parameters matching `no_decay_patterns` get no weight decay.
  std::vector<std::string> adamw_patterns;
  std::vector<std::string> no_decay_patterns;
  LrSchedule schedule;
  // > 0: AdamW's second moment stops changing after this step (set when
  // gradient compression starts with parallel.freeze_variance; kernels/adamw.h).
  int64_t variance_frozen_at = 0;
};

// Splits "a, b,c" into {"a", "b", "c"} (empty entries dropped).
std::vector<std::string> split_patterns(const std::string& list);
bool matches_any(const std::string& name, const std::vector<std::string>& patterns);

// The per-parameter rules every optimizer here follows: Muon for 2-D hidden
// matrices under name = "muon" (unless listed in adamw_patterns); weight decay
// for matrices not listed in no_decay_patterns.
bool rule_uses_muon(const OptimizerOptions& o, const nn::Parameter& p);
bool rule_decays(const OptimizerOptions& o, const nn::Parameter& p);
// The kernel arguments of one AdamW step of a parameter (decay: whether
// weight decay applies to it); grad_mult multiplies its gradient first.
kernels::AdamWArgs adamw_args(const OptimizerOptions& o, bool decay, int64_t step, double lr,
                              double grad_mult);
// Moonlight's scale of the orthogonalised update, 0.2 sqrt(max(rows, cols)),
// so Muon reuses AdamW's learning rate and weight decay.
double muon_rms_scale(int64_t rows, int64_t cols);

struct StepInfo {
  double lr = 0;
  double grad_norm = 0;  // before clipping, of the unscaled gradient
  double clip_coef = 1;
};

// The dtype the moments of a parameter with `master` dtype are stored in:
// o.moment_dtype for fp32 and bf16 masters, f64 for f64 (gradient checks).
DType moment_storage(const OptimizerOptions& o, DType master);
// The master dtype of a parameter whose working copy has dtype `value`:
// f64 for f64, bf16 for bf16 under o.master_dtype = bf16, else f32.
DType master_storage(const OptimizerOptions& o, DType value);

// A named piece of optimizer state, for checkpoints ("<param>.exp_avg", ...).
struct StateTensor {
  std::string name;
  Tensor tensor;
};

// The part of a named state tensor this rank holds: elements
// [offset, offset + values.numel()) of the flattened tensor of `total`
// elements. A one-rank optimizer holds everything (offset 0); a sharded one
// (ZeRO-1) a slice, so checkpoints store slices and re-cut them on load.
// Slices are saved in the live state's dtype (bf16 moments as bf16, so a
// resume is bit-exact) and converted on load when the live dtype differs
// (optim.moment_dtype changed between runs: rounded to nearest even, or
// widened exactly).
struct StateSlice {
  std::string name;
  Tensor values;  // 1-D view of the live state
  int64_t offset = 0;
  int64_t total = 0;
  bool required = true;  // false: a checkpoint without it leaves the zeros (with a notice)
  // Held whole by every rank of a sharded optimizer's group (experts under
  // ZeRO-1 with ep): stored once, by the rank the checkpoint's `writes` names.
  bool replicated = false;
  // The same elements are held, and stored, by another rank of a sharded
  // optimizer (under tp a ZeRO-1 chunk of what every tp rank holds whole is
  // stored by tp rank 0; of a kv-head block replicated over tp ranks, by its
  // primary): skipped by checkpoints, filled on load.
  bool duplicate = false;
  // Set when `values` is part of this rank's tp block of that parameter's
  // state: elements [offset, offset + numel) of the block's row-major order
  // (the whole block for a one-rank optimizer, a chunk of it under ZeRO-1);
  // total = the full tensor's elements. Checkpoints store it as a block (or
  // a range of one) and re-cut it for any other tp and dp.
  const nn::Parameter* block_of = nullptr;
};

// What the trainer and checkpoints need from an optimizer, one-rank or
// distributed. Calls marked collective must be made by every rank of the
// optimizer's data-parallel group in the same order.
class ParamOptimizer {
 public:
  virtual ~ParamOptimizer() = default;
  // Global L2 norm of all gradients times grad_scale (collective).
  virtual double grad_norm(kernels::Context& ctx, double grad_scale) = 0;
  // One update at optimizer step `step` (1-based). grad_scale multiplies every
  // gradient first (1 / loss scale). Clipping uses the global norm (collective),
  // or `known_norm` when the caller already has grad_norm(ctx, grad_scale).
  virtual StepInfo step(kernels::Context& ctx, int64_t step, double grad_scale,
                        double known_norm) = 0;
  virtual const OptimizerOptions& options() const = 0;
  // This rank's moments/momenta.
  virtual std::vector<StateSlice> state_slices() = 0;
  // Whether ranks hold different parts (ZeRO-1) or all of it (replicated:
  // a checkpoint stores one copy).
  virtual bool sharded() const = 0;
  // fp32 master weights as this rank holds them, as pieces of the full
  // tensors (named by parameter): a one-rank optimizer's whole tensors (a
  // tp-sharded parameter's block), ZeRO-1's chunks (nothing gathered). The
  // StateSlice flags say which rank stores a piece, as for the state.
  virtual std::vector<StateSlice> checkpoint_masters() = 0;
  // Sets the master (and working copy) of one parameter from the value of
  // the block this rank holds (the whole tensor when it is not tp-sharded).
  virtual void load_master(const std::string& param_name, const Tensor& local) = 0;
  // After a checkpoint filled the views state_slices() returned.
  virtual void finish_state_load() {}
  // Whether this optimizer updates the parameter of that name.
  virtual bool holds(const std::string& param_name) const = 0;
  // AdamW's second moment is left as it is after `after_step` (0: never
  // frozen): 1-bit Adam's compression stage, where the update must be linear
  // in the (compressed, error-fed-back) gradients.
  virtual void freeze_variance(int64_t after_step) = 0;
};

class Optimizer final : public ParamOptimizer {
 public:
  // include: the parameters it updates (empty: all).
  Optimizer(nn::ParameterSet& params, OptimizerOptions opts,
            const std::function<bool(const nn::Parameter&)>& include = {});
  bool holds(const std::string& param_name) const override;

  double grad_norm(kernels::Context& ctx, double grad_scale) override;
  StepInfo step(kernels::Context& ctx, int64_t step, double grad_scale = 1.0,
                double known_norm = -1) override;
  std::vector<StateSlice> state_slices() override;
  bool sharded() const override { return false; }
  std::vector<StateSlice> checkpoint_masters() override;
  void load_master(const std::string& param_name, const Tensor& full) override;

  // Which rule a parameter follows.
  bool uses_muon(const nn::Parameter& p) const;
  // Views of the live moments/momenta (not the master weights), for save and load.
  std::vector<StateTensor> state();
  // The master copy of a parameter (the parameter's own value when it is
  // already in the master dtype).
  Tensor master(const std::string& param_name) const;
  const OptimizerOptions& options() const override { return opts_; }
  void freeze_variance(int64_t after_step) override { opts_.variance_frozen_at = after_step; }
  // Tensor parallelism: tp-sharded matrices are orthogonalised whole (the
  // update gathered over tp, Newton-Schulz run on the full matrix by every
  // tp rank, each keeping its block: exactly one rank's update), and
  // checkpoints see full tensors (masters and state gathered over tp, each
  // rank cutting its block on load). Collective over tp.group from then on.
  // Not with 8-bit state (its block scales follow the local block).
  void set_tensor_parallel(const nn::TensorParallel* tp);

 private:
  struct Slot {
    nn::Parameter* param;
    Tensor master;                   // master_storage(); aliases param->value when of its dtype
    Tensor m, v;                     // AdamW moments, or m = Muon momentum (moment_storage dtype)
    kernels::QuantizedState qm, qv;  // instead of m and v when moment_storage is u8
    kernels::FactoredMoment fv;      // instead of qv for a factored matrix
    bool muon;
    bool decay;
  };
  void muon_update(kernels::Context& ctx, Slot& s, double lr, double grad_mult, int64_t step);
  void adamw_update(kernels::Context& ctx, Slot& s, int64_t step, double lr, double grad_mult);
  // A slot's state tensors with their checkpoint names.
  std::vector<StateTensor> state_of(Slot& s);
  uint32_t state_key(const Slot& s, const char* part, int64_t step) const;
  Slot& slot(const std::string& param_name);

  OptimizerOptions opts_;
  std::vector<Slot> slots_;
  const nn::TensorParallel* tp_ = nullptr;
  bool tp_on() const { return tp_ && tp_->on(); }
  // Full-size state of sharded parameters handed to a checkpoint load: (slot, live, staged).
};

}  // namespace moetron::optim
