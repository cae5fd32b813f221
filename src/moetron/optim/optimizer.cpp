#include "moetron/optim/optimizer.h"

#include <fnmatch.h>

#include <cmath>
#include <sstream>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/master_update.h"
#include "moetron/kernels/stochastic_round.h"
#include "moetron/optim/newton_schulz.h"

namespace moetron::optim {

std::vector<std::string> split_patterns(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

bool rule_uses_muon(const OptimizerOptions& o, const nn::Parameter& p) {
  return o.name == "muon" && p.hidden_matrix && p.value.rank() == 2 &&
         !matches_any(p.name, o.adamw_patterns);
}

bool rule_decays(const OptimizerOptions& o, const nn::Parameter& p) {
  return p.value.rank() >= 2 && !matches_any(p.name, o.no_decay_patterns);
}

DType moment_storage(const OptimizerOptions& o, DType master) {
  return master == DType::f64 ? master : o.moment_dtype;
}

DType master_storage(const OptimizerOptions& o, DType value) {
  if (value == DType::f64) return DType::f64;
  return value == DType::bf16 && o.master_dtype == DType::bf16 ? DType::bf16 : DType::f32;
}

kernels::AdamWArgs adamw_args(const OptimizerOptions& o, bool decay, int64_t step, double lr,
                              double grad_mult) {
  kernels::AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(o.beta1);
  a.beta2 = static_cast<float>(o.beta2);
  a.eps = static_cast<float>(o.eps);
  a.weight_decay = decay ? static_cast<float>(o.weight_decay) : 0.0f;
  a.step = step;
  a.variance_frozen_at = o.variance_frozen_at;
  a.grad_scale = static_cast<float>(grad_mult);
  return a;
}

double muon_rms_scale(int64_t rows, int64_t cols) {
  return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

Optimizer::Optimizer(nn::ParameterSet& params, OptimizerOptions opts,
                     const std::function<bool(const nn::Parameter&)>& include)
    : opts_(std::move(opts)) {
  MOETRON_CHECK(opts_.name == "adamw" || opts_.name == "muon",
                "optim.name must be adamw or muon, got '", opts_.name, "'");
  MOETRON_CHECK(opts_.moment_dtype == DType::f32 || opts_.moment_dtype == DType::bf16 ||
                    opts_.moment_dtype == DType::u8,
                "optim.moment_dtype must be fp32, bf16 or int8 (u8 codes), got ",
                dtype_name(opts_.moment_dtype));
  MOETRON_CHECK(opts_.master_dtype == DType::f32 || opts_.master_dtype == DType::bf16,
                "optim.master_dtype must be fp32 or bf16, got ", dtype_name(opts_.master_dtype));
  for (auto& p : params.all()) {
    if (include && !include(*p)) continue;
    Slot s;
    s.param = p.get();
    // f32, f64 in fp64 mode, or the bf16 working copy itself (the gradient
    // may be bf16: Precision::matrix_grad).
    const DType master = master_storage(opts_, p->value.dtype());
    const DType moments = moment_storage(opts_, master);
    if (p->value.dtype() == master) {
      s.master = p->value;
    } else {
      s.master = Tensor::empty(p->value.shape(), master, MemTag::optimizer);
      kernels::Context conv(kernels::Backend::reference);
      kernels::convert(conv, p->value, s.master);
    }
    s.muon = uses_muon(*p);
    s.decay = rule_decays(opts_, *p);
    if (moments == DType::u8) {
      using kernels::StateCode;
      s.qm = kernels::zero_quantized_state(p->value.numel(), StateCode::signed_e4m3,
                                           MemTag::optimizer);
      if (!s.muon && opts_.factored_second_moment && p->value.rank() == 2) {
        s.fv.row = Tensor::zeros({p->value.shape()[0]}, DType::f32, MemTag::optimizer);
        s.fv.col = Tensor::zeros({p->value.shape()[1]}, DType::f32, MemTag::optimizer);
      } else if (!s.muon) {
        s.qv = kernels::zero_quantized_state(p->value.numel(), StateCode::unsigned_e4m4,
                                             MemTag::optimizer);
      }
    } else {
      s.m = Tensor::zeros(p->value.shape(), moments, MemTag::optimizer);
      if (!s.muon) s.v = Tensor::zeros(p->value.shape(), moments, MemTag::optimizer);
    }
    slots_.push_back(std::move(s));
  }
}

bool Optimizer::uses_muon(const nn::Parameter& p) const {
  return rule_uses_muon(opts_, p);
}

double Optimizer::grad_norm(kernels::Context& ctx, double grad_scale) {
  double sq = 0;
  for (const auto& s : slots_) sq += kernels::sum_squares(ctx, s.param->grad);
  return std::sqrt(sq) * std::fabs(grad_scale);
}

StepInfo Optimizer::step(kernels::Context& ctx, int64_t step, double grad_scale,
                         double known_norm) {
  StepInfo info;
  info.lr = opts_.schedule.at(step);
  info.grad_norm = known_norm >= 0 ? known_norm : grad_norm(ctx, grad_scale);
  if (opts_.grad_clip > 0 && info.grad_norm > opts_.grad_clip) {
    info.clip_coef = opts_.grad_clip / (info.grad_norm + 1e-6);
  }
  const double mult = grad_scale * info.clip_coef;
  for (auto& s : slots_) {
    if (s.muon) {
      muon_update(ctx, s, info.lr, mult, step);
      continue;
    }
    adamw_update(ctx, s, step, info.lr, mult);
  }
  return info;
}

uint32_t Optimizer::state_key(const Slot& s, const char* part, int64_t step) const {
  return kernels::rounding_key(opts_.rounding_seed, s.param->name + part, step);
}

void Optimizer::adamw_update(kernels::Context& ctx, Slot& s, int64_t step, double lr,
                             double grad_mult) {
  kernels::AdamWArgs a = adamw_args(opts_, s.decay, step, lr, grad_mult);
  if (s.master.dtype() == DType::bf16) a.rounding_key = state_key(s, "", step);
  const bool separate = s.master.raw() != s.param->value.raw();
  // The fused write of the working copy takes f32/bf16; an f16 copy is
  // rounded from the master afterwards.
  const bool fused_copy = separate && s.param->value.dtype() != DType::f16;
  const Shape flat{s.master.numel()};
  const Tensor copy = fused_copy ? s.param->value.reshape(flat) : Tensor();
  if (s.fv.row.defined()) {
    kernels::adamw_step_q8_factored(ctx, s.master.reshape(flat), s.param->grad.reshape(flat), s.qm,
                                    s.fv, a, state_key(s, ".exp_avg", step), copy);
  } else if (s.qm.codes.defined()) {
    kernels::adamw_step_q8(ctx, s.master.reshape(flat), s.param->grad.reshape(flat), s.qm, s.qv, a,
                           state_key(s, ".exp_avg", step), state_key(s, ".exp_avg_sq", step), copy);
  } else {
    kernels::adamw_step(ctx, s.master.reshape(flat), s.param->grad.reshape(flat), s.m.reshape(flat),
                        s.v.reshape(flat), a, copy);
  }
  if (separate && !fused_copy) kernels::convert(ctx, s.master, s.param->value);
}

void Optimizer::muon_update(kernels::Context& ctx, Slot& s, double lr, double grad_mult,
                            int64_t step) {
  // m = beta m + (1 - beta) g; u = nesterov ? (1 - beta) g + beta m : m.
  // A bf16 or 8-bit momentum is widened into an fp32 workspace, updated and
  // used there, and rounded back once.
  const auto beta = static_cast<float>(opts_.muon_momentum);
  const Tensor& g = s.param->grad;
  const DType work = s.master.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const bool quantized = s.qm.codes.defined();
  const bool narrow = quantized || s.m.dtype() != work;
  Tensor m = s.m;
  if (narrow) {
    m = Tensor::empty(g.shape(), work, MemTag::workspace);
    if (quantized) {
      kernels::dequantize_state(ctx, s.qm, m);
    } else {
      kernels::convert(ctx, s.m, m);
    }
  }
  kernels::scale(ctx, m, beta, m);
  kernels::axpy(ctx, static_cast<float>((1.0 - beta) * grad_mult), g, m);
  Tensor u = Tensor::empty(g.shape(), work, MemTag::workspace);
  if (opts_.muon_nesterov) {
    kernels::scale(ctx, m, beta, u);
    kernels::axpy(ctx, static_cast<float>((1.0 - beta) * grad_mult), g, u);
  } else {
    u.copy_from(m);
  }
  if (quantized) {
    kernels::quantize_state(ctx, m, s.qm, state_key(s, ".momentum", step));
  } else if (narrow) {
    kernels::convert(ctx, m, s.m);
  }
  Tensor o = Tensor::empty(g.shape(), work, MemTag::workspace);
  const bool whole = tp_on() && s.param->sharded();
  if (whole) {
    const Tensor u_full = nn::gather_shards(*tp_, *s.param, u);
    Tensor o_full = Tensor::empty(u_full.shape(), u_full.dtype(), MemTag::workspace);
    newton_schulz(ctx, u_full, o_full, opts_.muon_ns_steps);
    nn::copy_shard(*s.param, o_full, o);
  } else {
    newton_schulz(ctx, u, o, opts_.muon_ns_steps);
  }
  // Moonlight: W -= lr * (0.2 sqrt(max(rows, cols)) O + wd W), so Muon reuses
  // AdamW's learning rate and weight decay (update RMS ~ 0.2).
  const Shape& full = whole ? s.param->shard.full : g.shape();
  const double rms_scale = muon_rms_scale(full[0], full[1]);
  if (s.master.dtype() == DType::bf16) {  // one stochastically rounded pass
    const double decay = s.decay ? 1.0 - lr * opts_.weight_decay : 1.0;
    kernels::master_update(ctx, s.master, static_cast<float>(decay),
                           static_cast<float>(-lr * rms_scale), o, state_key(s, "", step));
    return;
  }
  if (s.decay && opts_.weight_decay > 0) {
    kernels::scale(ctx, s.master, static_cast<float>(1.0 - lr * opts_.weight_decay), s.master);
  }
  kernels::axpy(ctx, static_cast<float>(-lr * rms_scale), o, s.master);
  if (s.master.raw() != s.param->value.raw()) kernels::convert(ctx, s.master, s.param->value);
}

// 8-bit state is stored as it lives: "<moment>.q8" codes and "<moment>.q8_scale"
// block scales (AdamW's second moment as "exp_avg_sqrt": the codes hold
// sqrt(v)); a factored one as "exp_avg_sq_row" and "exp_avg_sq_col".
std::vector<StateTensor> Optimizer::state_of(Slot& s) {
  const std::string first = s.param->name + (s.muon ? ".momentum" : ".exp_avg");
  if (!s.qm.codes.defined()) {
    std::vector<StateTensor> out = {{first, s.m}};
    if (s.v.defined()) out.push_back({s.param->name + ".exp_avg_sq", s.v});
    return out;
  }
  std::vector<StateTensor> out = {{first + ".q8", s.qm.codes}, {first + ".q8_scale", s.qm.scales}};
  if (s.qv.codes.defined()) {
    const std::string second = s.param->name + ".exp_avg_sqrt";
    out.push_back({second + ".q8", s.qv.codes});
    out.push_back({second + ".q8_scale", s.qv.scales});
  }
  if (s.fv.row.defined()) {
    out.push_back({s.param->name + ".exp_avg_sq_row", s.fv.row});
    out.push_back({s.param->name + ".exp_avg_sq_col", s.fv.col});
  }
  return out;
}

std::vector<StateTensor> Optimizer::state() {
  std::vector<StateTensor> out;
  for (auto& s : slots_) {
    for (auto& t : state_of(s)) out.push_back(std::move(t));
  }
  return out;
}

std::vector<StateSlice> Optimizer::state_slices() {
  std::vector<StateSlice> out;
  for (auto& s : slots_) {
    for (auto& [name, live] : state_of(s)) {
      const int64_t numel = live.numel();
      StateSlice sl{name, live.reshape({numel}), 0, numel};
      // 8-bit state is refused under tp (set_tensor_parallel): its block
      // scales follow this rank's flattened block, not the full tensor.
      if (tp_on() && s.param->sharded()) {  // this rank's block, stored as one
        sl.total = s.param->shard.full.numel();
        sl.block_of = s.param;
      }
      out.push_back(std::move(sl));
    }
  }
  return out;
}

std::vector<StateSlice> Optimizer::checkpoint_masters() {
  std::vector<StateSlice> out;
  for (auto& s : slots_) {
    const int64_t numel = s.master.numel();
    StateSlice sl{s.param->name, s.master.reshape({numel}), 0, numel};
    if (tp_on() && s.param->sharded()) {  // this rank's block
      sl.total = s.param->shard.full.numel();
      sl.block_of = s.param;
    }
    out.push_back(std::move(sl));
  }
  return out;
}

void Optimizer::set_tensor_parallel(const nn::TensorParallel* tp) {
  MOETRON_CHECK(!(tp && tp->on()) || opts_.moment_dtype != DType::u8,
                "optim.moment_dtype = int8 is not built for tensor parallelism (parallel.tp > 1)");
  tp_ = tp;
}

bool Optimizer::holds(const std::string& param_name) const {
  for (const auto& s : slots_) {
    if (s.param->name == param_name) return true;
  }
  return false;
}

Optimizer::Slot& Optimizer::slot(const std::string& param_name) {
  for (auto& s : slots_) {
    if (s.param->name == param_name) return s;
  }
  MOETRON_FAIL("optimizer has no parameter '", param_name, "'");
}

void Optimizer::load_master(const std::string& param_name, const Tensor& local) {
  Slot& s = slot(param_name);
  kernels::Context conv(kernels::Backend::reference);
  check_shape(local, param_name.c_str(), s.master.shape());
  kernels::convert(conv, local, s.master);
  if (s.master.raw() != s.param->value.raw()) kernels::convert(conv, s.master, s.param->value);
}

Tensor Optimizer::master(const std::string& param_name) const {
  for (const auto& s : slots_) {
    if (s.param->name == param_name) return s.master;
  }
  MOETRON_FAIL("optimizer has no parameter '", param_name, "'");
}

}  // namespace moetron::optim
