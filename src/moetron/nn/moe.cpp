#include "moetron/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "moetron/kernels/activation.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/linear.h"
#include "moetron/nn/recompute.h"

namespace moetron::nn {

// Balancing statistics of the [T, E] router tensors, in their dtype (f32 or
// f64): this rank's partial sums, reduced over the balance group (the ranks
// that split one micro-batch) so every layout sees the global values.
struct BalanceSums {
  std::vector<double> counts, score_sums;  // per expert: top-k choices, sum of router scores
  double lse_sq_sum = 0;                   // sum over tokens of logsumexp(logits)^2
  double tokens = 0;
};

namespace {

template <typename T>
double logsumexp_row(const T* row, int64_t e) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < e; ++i) mx = std::max(mx, static_cast<double>(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < e; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
  return mx + std::log(sum);
}

template <typename T>
BalanceSums local_balance_sums(const Tensor& logits, const Tensor& scores,
                               const std::vector<int64_t>& counts, bool need_z) {
  const int64_t t = logits.dim(0), e = logits.dim(1);
  BalanceSums b;
  b.counts.assign(counts.begin(), counts.end());
  b.score_sums.assign(static_cast<size_t>(e), 0.0);
  b.tokens = static_cast<double>(t);
  const T* sc = scores.data<T>();
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < e; ++i) b.score_sums[static_cast<size_t>(i)] += sc[r * e + i];
  if (need_z) {
    const T* lg = logits.data<T>();
    for (int64_t r = 0; r < t; ++r) {
      const double lse = logsumexp_row(lg + r * e, e);
      b.lse_sq_sum += lse * lse;
    }
  }
  return b;
}

// One small f64 allreduce of [counts, score sums, lse^2 sum, tokens].
void reduce_balance_sums(comm::Communicator* group, BalanceSums& b) {
  if (!group || group->size() == 1) return;
  const auto e = static_cast<int64_t>(b.counts.size());
  Tensor buf = Tensor::empty({2 * e + 2}, DType::f64, MemTag::comm);
  double* p = buf.data<double>();
  std::copy(b.counts.begin(), b.counts.end(), p);
  std::copy(b.score_sums.begin(), b.score_sums.end(), p + e);
  p[2 * e] = b.lse_sq_sum;
  p[2 * e + 1] = b.tokens;
  group->allreduce(buf, comm::ReduceOp::sum);
  std::copy(p, p + e, b.counts.begin());
  std::copy(p + e, p + 2 * e, b.score_sums.begin());
  b.lse_sq_sum = p[2 * e];
  b.tokens = p[2 * e + 1];
}

// Switch aux loss alpha * E * sum_i f_i P_i (f_i = share of the T*K choices on
// expert i, not differentiable; P_i = mean router score) and ST-MoE z-loss
// (1/T) sum_t lse_t^2, over the global token set.
void balancing_values(const BalanceSums& b, int64_t k, double aux_coef, double z_coef,
                      MoeStats& stats) {
  const auto e = static_cast<int64_t>(b.counts.size());
  if (aux_coef > 0) {
    double aux = 0;
    for (int64_t i = 0; i < e; ++i) {
      aux += (b.counts[static_cast<size_t>(i)] / (b.tokens * static_cast<double>(k))) *
             (b.score_sums[static_cast<size_t>(i)] / b.tokens);
    }
    stats.aux_loss = aux_coef * static_cast<double>(e) * aux;
  }
  if (z_coef > 0) stats.z_loss = z_coef * b.lse_sq_sum / b.tokens;
}

// Gradients of weight * (aux + z) on this rank's tokens: d aux / d s_ti =
// alpha E f_i / T and d z / d logit_ti = (2/T) lse_t softmax_ti, T global.
template <typename T>
void balancing_gradients(const Tensor& logits, const BalanceSums& b, int64_t k, double aux_coef,
                         double z_coef, double weight, const Tensor& d_scores,
                         const Tensor& d_logits_z) {
  const int64_t t = logits.dim(0), e = logits.dim(1);
  if (aux_coef > 0) {
    T* ds = d_scores.data<T>();
    for (int64_t i = 0; i < e; ++i) {
      const double f = b.counts[static_cast<size_t>(i)] / (b.tokens * static_cast<double>(k));
      const auto g = static_cast<T>(weight * aux_coef * static_cast<double>(e) * f / b.tokens);
      for (int64_t r = 0; r < t; ++r) ds[r * e + i] = g;
    }
  }
  if (z_coef > 0) {
    const T* lg = logits.data<T>();
    T* dz = d_logits_z.data<T>();
    for (int64_t r = 0; r < t; ++r) {
      const double lse = logsumexp_row(lg + r * e, e);
      for (int64_t i = 0; i < e; ++i) {
        const double sm = std::exp(static_cast<double>(lg[r * e + i]) - lse);
        dz[r * e + i] = static_cast<T>(weight * z_coef * 2.0 * lse * sm / b.tokens);
      }
    }
  }
}

}  // namespace

MoeLayer::MoeLayer(const ModelConfig& model, const MoeConfig& moe, const std::string& prefix,
                   Precision prec, ParameterSet& params, ExpertParallel ep)
    : prefix_(prefix),
      d_(model.d_model),
      e_(moe.num_experts),
      k_(moe.top_k),
      f_(moe.expert_hidden),
      ep_size_(ep.size),
      e_local_(moe.num_experts / std::max<int64_t>(ep.size, 1)),
      e_first_(ep.rank * e_local_),
      aux_coef_(moe.aux_loss_coef),
      z_coef_(moe.z_loss_coef),
      capacity_factor_(moe.capacity_factor),
      use_bias_(moe.bias_update_rate > 0),
      prec_(prec),
      load_(static_cast<size_t>(moe.num_experts), 0) {
  MOETRON_CHECK(ep.size >= 1 && e_ % ep.size == 0 && ep.rank >= 0 && ep.rank < ep.size, prefix,
                "block_sparse_moe: ", e_, " experts do not split over ", ep.size,
                " expert-parallel ranks (moe.num_experts % parallel.ep must be 0)");
  router_args_.k = static_cast<int>(k_);
  router_args_.score =
      moe.router_score == "sigmoid" ? kernels::RouterScore::sigmoid : kernels::RouterScore::softmax;
  router_args_.renormalize = moe.renormalize;
  const auto std = static_cast<float>(model.init_std);
  const auto out_std =
      static_cast<float>(model.init_std / std::sqrt(2.0 * static_cast<double>(model.n_layers)));
  // The router runs in the accumulation dtype: its logits decide discrete
  // choices, and bf16 rounding would flip near-ties.
  router_ = &params.add(prefix + "block_sparse_moe.gate.weight", {e_, d_}, prec.accum, prec.accum,
                        ParallelKind::replicated, InitKind::normal, std, false);
  w13_ = Tensor::empty({e_local_, 2 * f_, d_}, prec.compute, MemTag::params);
  w13_grad_ = Tensor::zeros({e_local_, 2 * f_, d_}, prec.matrix_grad(), MemTag::grads);
  w2_ = Tensor::empty({e_local_, d_, f_}, prec.compute, MemTag::params);
  w2_grad_ = Tensor::zeros({e_local_, d_, f_}, prec.matrix_grad(), MemTag::grads);
  for (int64_t jl = 0; jl < e_local_; ++jl) {
    const int64_t j = e_first_ + jl;  // global index: the name every layout shares
    const std::string ex = prefix + "block_sparse_moe.experts." + std::to_string(j) + ".";
    const Tensor w13 = w13_[jl], g13 = w13_grad_[jl];
    Parameter& w1 = params.add_view(ex + "w1.weight", w13.slice(0, f_), g13.slice(0, f_),
                                    ParallelKind::expert, InitKind::normal, std, true);
    Parameter& w3 = params.add_view(ex + "w3.weight", w13.slice(f_, 2 * f_), g13.slice(f_, 2 * f_),
                                    ParallelKind::expert, InitKind::normal, std, true);
    Parameter& w2 = params.add_view(ex + "w2.weight", w2_[jl], w2_grad_[jl], ParallelKind::expert,
                                    InitKind::normal, out_std, true);
    w1.expert = w3.expert = w2.expert = j;
  }
  bias_ = Tensor::zeros({e_}, prec.accum, MemTag::params);
  if (moe.shared_experts > 0) {
    const int64_t hidden =
        (moe.shared_expert_hidden > 0 ? moe.shared_expert_hidden : f_) * moe.shared_experts;
    shared_ = std::make_unique<SwiGluMlp>(d_, hidden, prefix + "mlp.shared_experts.", std, out_std,
                                          prec, params);
  }
  setup_modality_routing(moe, params);
}

MoeStats MoeLayer::forward(kernels::Context& ctx, const Tensor& x, const Tensor& y,
                           double loss_weight) {
  const int64_t t = x.dim(0);
  check_shape(x, "MoE input", {t, d_});
  saved_ = Saved{};
  Saved& s = saved_;  // filled in place: the expert-parallel exchange reads it
  s.x = x;
  s.loss_weight = loss_weight;
  s.modality = modality_;
  s.x_router = router_input(ctx, x, s.modality);
  route(ctx);
  record_routing(s.topk_idx);
  const int32_t* idx = s.topk_idx.data<int32_t>();
  std::vector<int64_t> counts(static_cast<size_t>(e_), 0);
  for (int64_t i = 0; i < t * k_; ++i) ++counts[static_cast<size_t>(idx[i])];
  if (!recompute_pass_) {
    for (int64_t j = 0; j < e_; ++j)
      load_[static_cast<size_t>(j)] += counts[static_cast<size_t>(j)];
    count_modality_load(counts);
  }
  if (ep_size_ > 1) {
    plan_expert_parallel(counts, t);
  } else {
    const int64_t capacity =
        capacity_factor_ > 0
            ? static_cast<int64_t>(std::ceil(static_cast<double>(t * k_) * capacity_factor_ /
                                             static_cast<double>(e_)))
            : 0;
    s.plan = kernels::moe_plan(s.topk_idx, e_, capacity);
  }

  // rows: the local experts' rows (received from the ep ranks under expert parallelism).
  s.permuted = dispatch(ctx, x);
  const int64_t rows = s.permuted.dim(0);
  s.gate_up = Tensor::empty({rows, 2 * f_}, prec_.compute);
  kernels::grouped_matmul(ctx, s.permuted, w13_, expert_offsets(), s.gate_up, true, 0.0f);
  s.act = Tensor::empty({rows, f_}, prec_.compute);
  kernels::swiglu_forward(ctx, s.gate_up, s.act);
  s.expert_out = Tensor::empty({rows, d_}, prec_.compute);
  kernels::grouped_matmul(ctx, s.act, w2_, expert_offsets(), s.expert_out, true, 0.0f);
  if (ep_size_ > 1) s.expert_out = from_experts(ctx, s.expert_out);
  kernels::moe_unpermute(ctx, s.expert_out, s.plan, s.topk_weight, y);
  if (shared_) shared_->forward(ctx, x, y, 1.0f);

  MoeStats stats;
  stats.dropped = s.plan.dropped;
  // With modality-aware balancing the Switch loss is the per-modality one.
  const double global_aux = modality_losses_.aux_coef > 0 ? 0.0 : aux_coef_;
  if (global_aux > 0 || z_coef_ > 0) {
    // Values now; their gradients are formed again in backward from the
    // saved global sums (cheap, [T, E]) so forward keeps no [T, E] gradients.
    auto sums = std::make_shared<BalanceSums>(
        prec_.accum == DType::f64
            ? local_balance_sums<double>(s.logits, s.scores, counts, z_coef_ > 0)
            : local_balance_sums<float>(s.logits, s.scores, counts, z_coef_ > 0));
    reduce_balance_sums(balance_group_, *sums);
    balancing_values(*sums, k_, global_aux, z_coef_, stats);
    s.balance = std::move(sums);
  }
  if (modality_losses_on_) {
    auto sums = std::make_shared<ModalitySums>(
        local_modality_sums(s.scores, s.topk_idx, s.modality, num_modalities_));
    reduce_modality_sums(balance_group_, *sums);
    const ModalityLossValues v = modality_loss_values(*sums, owner_, k_, modality_losses_);
    stats.aux_loss += v.aux;
    stats.entropy_loss = v.entropy;
    s.modality_sums = std::move(sums);
  }
  drop_after_forward();
  return stats;
}

void MoeLayer::backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx) {
  Saved& s = saved_;
  MOETRON_CHECK(s.x.defined(), "MoE backward without a saved forward");
  const int64_t t = s.x.dim(0), rows = s.gate_up.dim(0);
  if (shared_) shared_->backward(ctx, dy, dx, 0.0f);

  Tensor d_expert_out = Tensor::empty({s.plan.rows(), d_}, prec_.compute);
  Tensor d_topk_weight = Tensor::empty({t, k_}, prec_.accum);
  const bool outputs_kept = s.expert_out.defined();
  if (outputs_kept) {
    kernels::moe_unpermute_backward(ctx, dy, s.expert_out, s.plan, s.topk_weight, d_expert_out,
                                    d_topk_weight);
    if (ep_size_ > 1) d_expert_out = to_experts(ctx, d_expert_out);
  } else {
    // moe_out (one rank holds every expert): the down projection of the
    // unweighted gradient, then the weights' gradient from d_act . act and
    // both gradients weighted in place (kernels/moe.h).
    kernels::moe_permute(ctx, dy, s.plan, d_expert_out);
  }
  // Allocated after the exchange: the order the memory model replays.
  Tensor d_act = Tensor::empty({rows, f_}, prec_.compute);
  kernels::grouped_matmul(ctx, d_expert_out, w2_, expert_offsets(), d_act, false, 0.0f);
  rebuild_act(ctx);
  if (!outputs_kept) {
    const RecomputeTimer timer;
    kernels::moe_combine_weight_grad(ctx, s.act, s.plan, s.topk_weight, d_act, d_expert_out,
                                     d_topk_weight);
  }
  kernels::grouped_matmul_weight_grad(ctx, d_expert_out, s.act, expert_offsets(), w2_grad_, 1.0f);
  d_expert_out = Tensor();
  s.act = Tensor();
  // In place: each element's gradient replaces the gate-up value it needed.
  Tensor d_gate_up = std::exchange(s.gate_up, Tensor());
  kernels::swiglu_backward(ctx, d_act, d_gate_up, d_gate_up);
  d_act = Tensor();
  rebuild_permuted(ctx);
  kernels::grouped_matmul_weight_grad(ctx, d_gate_up, s.permuted, expert_offsets(), w13_grad_,
                                      1.0f);
  Tensor d_permuted = Tensor::empty({rows, d_}, prec_.compute);
  kernels::grouped_matmul(ctx, d_gate_up, w13_, expert_offsets(), d_permuted, false, 0.0f);
  d_gate_up = Tensor();
  if (ep_size_ > 1) d_permuted = from_experts(ctx, d_permuted);
  Tensor d_routed = Tensor::empty({t, d_}, prec_.compute);
  kernels::moe_permute_backward(ctx, d_permuted, s.plan, d_routed);
  if (shared_) {
    kernels::add(ctx, dx, d_routed, dx);
  } else {
    dx.copy_from(d_routed);
  }
  d_routed = Tensor();

  // Router: gradient through the combine weights plus the balancing losses.
  Tensor d_scores, d_logits_z;
  const double global_aux = modality_losses_.aux_coef > 0 ? 0.0 : aux_coef_;
  if (s.modality_sums) {
    d_scores = Tensor::zeros({t, e_}, prec_.accum);
  } else if (global_aux > 0) {
    d_scores = Tensor::empty({t, e_}, prec_.accum);
  }
  if (z_coef_ > 0) d_logits_z = Tensor::empty({t, e_}, prec_.accum);
  if (s.balance) {
    if (prec_.accum == DType::f64) {
      balancing_gradients<double>(s.logits, *s.balance, k_, global_aux, z_coef_, s.loss_weight,
                                  d_scores, d_logits_z);
    } else {
      balancing_gradients<float>(s.logits, *s.balance, k_, global_aux, z_coef_, s.loss_weight,
                                 d_scores, d_logits_z);
    }
  }
  if (s.modality_sums) {
    add_modality_loss_gradients(s.scores, s.modality, *s.modality_sums, owner_, k_,
                                modality_losses_, s.loss_weight, d_scores);
  }
  Tensor d_logits = Tensor::empty({t, e_}, prec_.accum);
  kernels::router_topk_backward(ctx, d_topk_weight, d_scores, s.scores, s.topk_idx, s.topk_weight,
                                router_args_, d_logits);
  if (d_logits_z.defined()) kernels::add(ctx, d_logits, d_logits_z, d_logits);
  rebuild_router_input(ctx);
  if (s.x_router.raw() == s.x.raw()) {
    linear_backward(ctx, d_logits, s.x_router, router_->value, router_->grad, dx, 1.0f);
  } else {
    Tensor dx_router = Tensor::empty({t, d_}, prec_.accum);
    linear_backward(ctx, d_logits, s.x_router, router_->value, router_->grad, dx_router, 0.0f);
    modality_backward(d_logits, dx_router);
    if (dx.dtype() == prec_.accum) {
      kernels::add(ctx, dx, dx_router, dx);
    } else {
      Tensor dx_router_c = Tensor::empty({t, d_}, prec_.compute);
      kernels::convert(ctx, dx_router, dx_router_c);
      kernels::add(ctx, dx, dx_router_c, dx);
    }
  }
  release();
}

void MoeLayer::release() {
  saved_ = Saved{};
  if (shared_) shared_->release();  // the shared experts' saved tensors, too
}

void MoeLayer::set_expert_load(std::vector<int64_t> load) {
  MOETRON_CHECK(static_cast<int64_t>(load.size()) == e_, "expert load of ", load.size(),
                " entries for ", e_, " experts");
  load_ = std::move(load);
}

void MoeLayer::reset_load() {
  std::fill(load_.begin(), load_.end(), 0);
  std::fill(modality_load_.begin(), modality_load_.end(), 0);
}

void MoeLayer::update_bias(double rate) {
  double mean = 0;
  for (int64_t c : load_) mean += static_cast<double>(c);
  mean /= static_cast<double>(e_);
  for (int64_t j = 0; j < e_; ++j) {
    const double c = static_cast<double>(load_[static_cast<size_t>(j)]);
    const double step = c > mean ? -rate : (c < mean ? rate : 0.0);
    if (bias_.dtype() == DType::f64) {
      bias_.data<double>()[j] += step;
    } else {
      bias_.data<float>()[j] += static_cast<float>(step);
    }
  }
  reset_load();
}

}  // namespace moetron::nn
