// MoeLayer's modality-aware routing (nn/modality_routing.h): settings, the
// prior's router input and logit biases with their gradients, partitioned
// routing, per-modality loads and the adaptive expert allocation.
#include <algorithm>

#include "moetron/kernels/elementwise.h"
#include "moetron/nn/linear.h"
#include "moetron/nn/moe.h"

namespace moetron::nn {

namespace {

// dst[t] += table[ids[t]]; dst [T, W], table [M, W], one float dtype.
template <typename T>
void add_table_rows(const Tensor& dst, const Tensor& table, const std::vector<int32_t>& ids) {
  const int64_t w = dst.dim(1);
  T* d = dst.data<T>();
  const T* tb = table.data<T>();
  for (size_t r = 0; r < ids.size(); ++r)
    for (int64_t j = 0; j < w; ++j) d[static_cast<int64_t>(r) * w + j] += tb[ids[r] * w + j];
}

// table_grad[ids[t]] += src[t], tokens in order (deterministic).
template <typename T>
void scatter_add_rows(const Tensor& table_grad, const Tensor& src,
                      const std::vector<int32_t>& ids) {
  const int64_t w = src.dim(1);
  T* g = table_grad.data<T>();
  const T* sp = src.data<T>();
  for (size_t r = 0; r < ids.size(); ++r)
    for (int64_t j = 0; j < w; ++j) g[ids[r] * w + j] += sp[static_cast<int64_t>(r) * w + j];
}

void add_rows(const Tensor& dst, const Tensor& table, const std::vector<int32_t>& ids) {
  if (dst.dtype() == DType::f64) {
    add_table_rows<double>(dst, table, ids);
  } else {
    add_table_rows<float>(dst, table, ids);
  }
}

void scatter_rows(const Tensor& table_grad, const Tensor& src, const std::vector<int32_t>& ids) {
  if (src.dtype() == DType::f64) {
    scatter_add_rows<double>(table_grad, src, ids);
  } else {
    scatter_add_rows<float>(table_grad, src, ids);
  }
}

}  // namespace

void MoeLayer::setup_modality_routing(const MoeConfig& moe, ParameterSet& params) {
  routing_ = parse_modality_routing(moe.modality_routing);
  num_modalities_ = moe.num_modalities;
  MOETRON_CHECK(num_modalities_ >= 1, "moe.num_modalities = ", num_modalities_, ": must be >= 1");
  const bool partitioned = routing_ == ModalityRouting::partitioned;
  MOETRON_CHECK(partitioned || moe.modality_experts.empty(), "moe.modality_experts = \"",
                moe.modality_experts, "\" needs moe.modality_routing = \"partitioned\"");
  MOETRON_CHECK(partitioned || moe.modality_realloc_every == 0,
                "moe.modality_realloc_every = ", moe.modality_realloc_every,
                " needs moe.modality_routing = \"partitioned\"");
  MOETRON_CHECK(moe.modality_realloc_every >= 0,
                "moe.modality_realloc_every = ", moe.modality_realloc_every, ": must be >= 0");
  MOETRON_CHECK(moe.modality_realloc_hysteresis >= 0,
                "moe.modality_realloc_hysteresis = ", moe.modality_realloc_hysteresis,
                ": must be >= 0");
  MOETRON_CHECK(moe.modality_min_experts >= 1,
                "moe.modality_min_experts = ", moe.modality_min_experts, ": must be >= 1");
  MOETRON_CHECK(moe.modality_local_entropy_coef >= 0,
                "moe.modality_local_entropy_coef = ", moe.modality_local_entropy_coef,
                ": must be >= 0");
  MOETRON_CHECK(moe.modality_global_entropy_coef >= 0,
                "moe.modality_global_entropy_coef = ", moe.modality_global_entropy_coef,
                ": must be >= 0");
  owner_ = partitioned ? initial_expert_owners(moe.modality_experts, num_modalities_, e_, k_)
                       : std::vector<int32_t>(static_cast<size_t>(e_), -1);
  modality_load_.assign(static_cast<size_t>(num_modalities_ * e_), 0);
  window_load_.assign(static_cast<size_t>(num_modalities_ * e_), 0.0);
  window_loss_.assign(static_cast<size_t>(num_modalities_), 0.0);
  realloc_every_ = moe.modality_realloc_every;
  alloc_rule_ = {moe.modality_min_experts, moe.modality_realloc_hysteresis, k_};
  modality_losses_.aux_coef = routing_ == ModalityRouting::shared ? 0.0 : aux_coef_;
  modality_losses_.local_entropy_coef = moe.modality_local_entropy_coef;
  modality_losses_.global_entropy_coef = moe.modality_global_entropy_coef;
  modality_losses_.global_entropy_threshold = moe.modality_global_entropy_threshold;
  const bool entropy =
      modality_losses_.local_entropy_coef > 0 || modality_losses_.global_entropy_coef > 0;
  MOETRON_CHECK(!entropy || router_args_.score == kernels::RouterScore::softmax,
                "moe.modality_*_entropy_coef needs moe.router_score = \"softmax\" (entropy of a "
                "distribution over experts)");
  modality_losses_on_ = entropy || modality_losses_.aux_coef > 0;
  if (routing_ == ModalityRouting::prior) {
    // Zero-initialised: training starts as the shared router.
    modality_embed_ = &params.add(prefix_ + "block_sparse_moe.gate.modality_embed",
                                  {num_modalities_, d_}, prec_.accum, prec_.accum,
                                  ParallelKind::replicated, InitKind::zeros, 0.0f, false);
    modality_bias_ = &params.add(prefix_ + "block_sparse_moe.gate.modality_bias",
                                 {num_modalities_, e_}, prec_.accum, prec_.accum,
                                 ParallelKind::replicated, InitKind::zeros, 0.0f, false);
  }
}

Tensor MoeLayer::router_input(kernels::Context& ctx, const Tensor& x, const Tensor& modality) {
  if (routing_ != ModalityRouting::prior && x.dtype() == prec_.accum) return x;
  Tensor out = Tensor::empty(x.shape(), prec_.accum);
  if (x.dtype() == prec_.accum) {
    out.copy_from(x);
  } else {
    kernels::convert(ctx, x, out);
  }
  if (routing_ == ModalityRouting::prior) {
    add_rows(out, modality_embed_->value, modality_ids(modality, x.dim(0), num_modalities_));
  }
  return out;
}

void MoeLayer::route(kernels::Context& ctx) {
  Saved& s = saved_;
  const int64_t t = s.x_router.dim(0);
  s.logits = Tensor::empty({t, e_}, prec_.accum);
  linear_forward(ctx, s.x_router, router_->value, s.logits);
  if (routing_ == ModalityRouting::prior) {
    add_rows(s.logits, modality_bias_->value, modality_ids(s.modality, t, num_modalities_));
  }
  s.scores = Tensor::empty({t, e_}, prec_.accum);
  s.topk_idx = Tensor::empty({t, k_}, DType::i32);
  s.topk_weight = Tensor::empty({t, k_}, prec_.accum);
  const Tensor bias = use_bias_ ? bias_ : Tensor();
  if (routing_ == ModalityRouting::partitioned) {
    partitioned_router_topk(ctx, s.logits, bias, router_args_, s.modality, num_modalities_, owner_,
                            s.scores, s.topk_idx, s.topk_weight);
  } else {
    kernels::router_topk(ctx, s.logits, bias, router_args_, s.scores, s.topk_idx, s.topk_weight);
  }
}

void MoeLayer::count_modality_load(const std::vector<int64_t>& counts) {
  const Saved& s = saved_;
  if (!s.modality.defined()) {  // every token is modality 0: the expert counts themselves
    for (int64_t j = 0; j < e_; ++j)
      modality_load_[static_cast<size_t>(j)] += counts[static_cast<size_t>(j)];
    return;
  }
  const int64_t t = s.topk_idx.dim(0);
  const std::vector<int32_t> ids = modality_ids(s.modality, t, num_modalities_);
  const int32_t* idx = s.topk_idx.data<int32_t>();
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < k_; ++i)
      ++modality_load_[static_cast<size_t>(ids[static_cast<size_t>(r)] * e_ + idx[r * k_ + i])];
}

void MoeLayer::modality_backward(const Tensor& d_logits, const Tensor& dx_router) {
  if (routing_ != ModalityRouting::prior) return;
  const Saved& s = saved_;
  const std::vector<int32_t> ids = modality_ids(s.modality, d_logits.dim(0), num_modalities_);
  scatter_rows(modality_bias_->grad, d_logits, ids);
  scatter_rows(modality_embed_->grad, dx_router, ids);
}

std::vector<std::vector<int64_t>> MoeLayer::expert_load_by_modality() const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t m = 0; m < num_modalities_; ++m) {
    out.emplace_back(modality_load_.begin() + m * e_, modality_load_.begin() + (m + 1) * e_);
  }
  return out;
}

void MoeLayer::set_expert_load_by_modality(std::vector<int64_t> flat) {
  MOETRON_CHECK(static_cast<int64_t>(flat.size()) == num_modalities_ * e_, prefix_,
                "block_sparse_moe: expert load by modality of ", flat.size(), " entries for ",
                num_modalities_, " x ", e_);
  modality_load_ = std::move(flat);
}

void MoeLayer::set_expert_owners(std::vector<int32_t> owner) {
  MOETRON_CHECK(static_cast<int64_t>(owner.size()) == e_, prefix_,
                "block_sparse_moe: ", owner.size(), " expert owners for ", e_, " experts");
  for (int32_t o : owner) {
    MOETRON_CHECK(
        o >= -1 && o < num_modalities_ && (o < 0 || routing_ == ModalityRouting::partitioned),
        prefix_, "block_sparse_moe: expert owner ", o, " invalid for ", num_modalities_,
        " modalities in this routing mode");
  }
  for (int32_t m = 0; m < num_modalities_; ++m) {
    MOETRON_CHECK(allowed_experts(owner, m) >= k_, prefix_, "block_sparse_moe: modality ", m,
                  " would have fewer than top_k usable experts");
  }
  owner_ = std::move(owner);
}

AllocationMove MoeLayer::update_allocation(std::span<const double> modality_loss) {
  if (routing_ != ModalityRouting::partitioned || realloc_every_ <= 0) return {};
  MOETRON_CHECK(
      modality_loss.empty() || static_cast<int64_t>(modality_loss.size()) == num_modalities_,
      prefix_, "block_sparse_moe: ", modality_loss.size(), " modality losses for ", num_modalities_,
      " modalities");
  for (size_t i = 0; i < window_load_.size(); ++i)
    window_load_[i] += static_cast<double>(modality_load_[i]);
  for (size_t m = 0; m < window_loss_.size(); ++m)
    window_loss_[m] += modality_loss.empty() ? 1.0 : modality_loss[m];
  if (++window_steps_ < realloc_every_) return {};
  std::vector<double> mean_loss(window_loss_.size());
  for (size_t m = 0; m < mean_loss.size(); ++m)
    mean_loss[m] = window_loss_[m] / static_cast<double>(window_steps_);
  const AllocationMove move =
      adapt_allocation(owner_, window_load_, mean_loss, num_modalities_, alloc_rule_);
  std::fill(window_load_.begin(), window_load_.end(), 0.0);
  std::fill(window_loss_.begin(), window_loss_.end(), 0.0);
  window_steps_ = 0;
  return move;
}

// Layout: window steps, owners [E], window load [M * E], window loss [M].
std::vector<double> MoeLayer::allocation_state() const {
  std::vector<double> out;
  out.push_back(static_cast<double>(window_steps_));
  for (int32_t o : owner_) out.push_back(o);
  out.insert(out.end(), window_load_.begin(), window_load_.end());
  out.insert(out.end(), window_loss_.begin(), window_loss_.end());
  return out;
}

void MoeLayer::set_allocation_state(std::span<const double> state) {
  const auto e = static_cast<size_t>(e_), m = static_cast<size_t>(num_modalities_);
  MOETRON_CHECK(state.size() == 1 + e + m * e + m, prefix_,
                "block_sparse_moe: allocation state of ", state.size(), " values, expected ",
                1 + e + m * e + m);
  std::vector<int32_t> owner(e);
  for (size_t j = 0; j < e; ++j) owner[j] = static_cast<int32_t>(state[1 + j]);
  set_expert_owners(std::move(owner));
  window_steps_ = static_cast<int64_t>(state[0]);
  std::copy_n(state.begin() + static_cast<std::ptrdiff_t>(1 + e), m * e, window_load_.begin());
  std::copy_n(state.begin() + static_cast<std::ptrdiff_t>(1 + e + m * e), m, window_loss_.begin());
}

}  // namespace moetron::nn
