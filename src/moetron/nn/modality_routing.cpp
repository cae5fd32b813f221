#include "moetron/nn/modality_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::nn {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

size_t at(int64_t row, int64_t col, int64_t width) {
  return static_cast<size_t>(row * width + col);
}

bool is_allowed(const std::vector<int32_t>& owner, int32_t m, int64_t e) {
  const int32_t o = owner[static_cast<size_t>(e)];
  return o < 0 || o == m;
}

template <typename T>
void route_partitioned(kernels::Context& ctx, const Tensor& logits, const Tensor& bias,
                       const kernels::RouterArgs& args, const std::vector<int32_t>& mod,
                       const std::vector<int32_t>& owner, const Tensor& scores,
                       const Tensor& topk_idx, const Tensor& topk_weight) {
  const int64_t t = logits.dim(0), e = logits.dim(1), k = args.k;
  T* lg = logits.data<T>();
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < e; ++j)
      if (!is_allowed(owner, mod[static_cast<size_t>(r)], j))
        lg[at(r, j, e)] = static_cast<T>(kNegInf);
  const int32_t modalities = mod.empty() ? 0 : *std::max_element(mod.begin(), mod.end()) + 1;
  for (int32_t m = 0; m < modalities; ++m) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < t; ++r)
      if (mod[static_cast<size_t>(r)] == m) rows.push_back(r);
    if (rows.empty()) continue;
    const auto n = static_cast<int64_t>(rows.size());
    Tensor sub_logits = Tensor::empty({n, e}, logits.dtype());
    Tensor sub_scores = Tensor::empty({n, e}, logits.dtype());
    Tensor sub_idx = Tensor::empty({n, k}, DType::i32);
    Tensor sub_w = Tensor::empty({n, k}, logits.dtype());
    Tensor sel_bias = Tensor::empty({e}, logits.dtype());
    for (int64_t j = 0; j < e; ++j) {
      const double b = bias.defined() ? static_cast<double>(bias.data<T>()[j]) : 0.0;
      sel_bias.data<T>()[j] = static_cast<T>(is_allowed(owner, m, j) ? b : kNegInf);
    }
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(lg + rows[static_cast<size_t>(i)] * e, e, sub_logits.data<T>() + i * e);
    kernels::router_topk(ctx, sub_logits, sel_bias, args, sub_scores, sub_idx, sub_w);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[static_cast<size_t>(i)];
      for (int64_t j = 0; j < e; ++j) {
        // Exactly 0 where disallowed (the kernel's exp may leave a denormal).
        scores.data<T>()[at(r, j, e)] =
            is_allowed(owner, m, j) ? sub_scores.data<T>()[at(i, j, e)] : T(0);
      }
      std::copy_n(sub_idx.data<int32_t>() + i * k, k, topk_idx.data<int32_t>() + r * k);
      std::copy_n(sub_w.data<T>() + i * k, k, topk_weight.data<T>() + r * k);
    }
  }
}

template <typename T>
ModalitySums sums_of(const Tensor& scores, const Tensor& topk_idx, const std::vector<int32_t>& mod,
                     int64_t num_modalities) {
  const int64_t t = scores.dim(0), e = scores.dim(1), k = topk_idx.dim(1);
  ModalitySums s;
  s.num_modalities = num_modalities;
  s.num_experts = e;
  s.tokens.assign(static_cast<size_t>(num_modalities), 0.0);
  s.entropy_sums.assign(static_cast<size_t>(num_modalities), 0.0);
  s.counts.assign(static_cast<size_t>(num_modalities * e), 0.0);
  s.score_sums.assign(static_cast<size_t>(num_modalities * e), 0.0);
  const T* sc = scores.data<T>();
  const int32_t* idx = topk_idx.data<int32_t>();
  for (int64_t r = 0; r < t; ++r) {
    const int32_t m = mod[static_cast<size_t>(r)];
    s.tokens[static_cast<size_t>(m)] += 1;
    double h = 0;
    for (int64_t j = 0; j < e; ++j) {
      const auto p = static_cast<double>(sc[at(r, j, e)]);
      s.score_sums[at(m, j, e)] += p;
      if (p > 0) h -= p * std::log(p);
    }
    s.entropy_sums[static_cast<size_t>(m)] += h;
    for (int64_t i = 0; i < k; ++i) s.counts[at(m, idx[at(r, i, k)], e)] += 1;
  }
  return s;
}

double entropy_of_mean(const ModalitySums& s, int64_t m) {
  const int64_t e = s.num_experts;
  const double tm = s.tokens[static_cast<size_t>(m)];
  double h = 0;
  for (int64_t j = 0; j < e; ++j) {
    const double p = s.score_sums[at(m, j, e)] / tm;
    if (p > 0) h -= p * std::log(p);
  }
  return h;
}

template <typename T>
void add_gradients(const Tensor& scores, const std::vector<int32_t>& mod, const ModalitySums& s,
                   const std::vector<int32_t>& owner, int64_t k, const ModalityLossConfig& cfg,
                   double weight, const Tensor& d_scores) {
  const int64_t t = scores.dim(0), e = scores.dim(1), mm = s.num_modalities;
  double total = 0;
  for (double x : s.tokens) total += x;
  // Per modality: the token-independent part of the gradient, [M, E].
  std::vector<double> shared_grad(static_cast<size_t>(mm * e), 0.0);
  std::vector<bool> global_active(static_cast<size_t>(mm), false);
  for (int64_t m = 0; m < mm; ++m) {
    const double tm = s.tokens[static_cast<size_t>(m)];
    if (tm <= 0) continue;
    const auto em = static_cast<double>(allowed_experts(owner, static_cast<int32_t>(m)));
    const bool global =
        cfg.global_entropy_coef > 0 && entropy_of_mean(s, m) < cfg.global_entropy_threshold;
    for (int64_t j = 0; j < e; ++j) {
      double g = 0;
      if (cfg.aux_coef > 0 && is_allowed(owner, static_cast<int32_t>(m), j)) {
        const double f = s.counts[at(m, j, e)] / (tm * static_cast<double>(k));
        g += cfg.aux_coef * em * f / total;
      }
      const double pbar = s.score_sums[at(m, j, e)] / tm;
      if (global && pbar > 0) g += cfg.global_entropy_coef * (std::log(pbar) + 1.0) / tm;
      shared_grad[at(m, j, e)] = weight * g;
    }
    global_active[static_cast<size_t>(m)] = global;
  }
  const T* sc = scores.data<T>();
  T* ds = d_scores.data<T>();
  for (int64_t r = 0; r < t; ++r) {
    const int32_t m = mod[static_cast<size_t>(r)];
    const double tm = s.tokens[static_cast<size_t>(m)];
    for (int64_t j = 0; j < e; ++j) {
      double g = shared_grad[at(m, j, e)];
      const auto p = static_cast<double>(sc[at(r, j, e)]);
      if (cfg.local_entropy_coef > 0 && p > 0) {
        g -= weight * cfg.local_entropy_coef * (std::log(p) + 1.0) / tm;
      }
      ds[at(r, j, e)] = static_cast<T>(static_cast<double>(ds[at(r, j, e)]) + g);
    }
  }
}

}  // namespace

ModalityRouting parse_modality_routing(const std::string& name) {
  if (name == "shared") return ModalityRouting::shared;
  if (name == "prior") return ModalityRouting::prior;
  if (name == "partitioned") return ModalityRouting::partitioned;
  MOETRON_FAIL("moe.modality_routing = \"", name,
               "\": expected \"shared\", \"prior\" or \"partitioned\"");
}

std::vector<int32_t> initial_expert_owners(const std::string& spec, int64_t num_modalities,
                                           int64_t num_experts, int64_t top_k) {
  MOETRON_CHECK(num_modalities >= 1, "moe.num_modalities = ", num_modalities, ": must be >= 1");
  std::vector<int64_t> counts;
  if (spec.empty()) {
    counts.assign(static_cast<size_t>(num_modalities), num_experts / num_modalities);
  } else {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t used = 0;
      int64_t v = -1;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MOETRON_CHECK(used > 0 && item.find_first_not_of(" ", used) == std::string::npos && v >= 0,
                    "moe.modality_experts = \"", spec, "\": \"", item,
                    "\" is not a count of experts (expected e.g. \"4,2,2\")");
      counts.push_back(v);
    }
    MOETRON_CHECK(static_cast<int64_t>(counts.size()) == num_modalities,
                  "moe.modality_experts = \"", spec, "\": ", counts.size(), " counts for ",
                  num_modalities, " modalities (moe.num_modalities)");
  }
  std::vector<int32_t> owner(static_cast<size_t>(num_experts), -1);
  int64_t next = 0;
  for (int64_t m = 0; m < num_modalities; ++m) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(m)]; ++i, ++next) {
      MOETRON_CHECK(next < num_experts, "moe.modality_experts = \"", spec, "\": more than the ",
                    num_experts, " experts (moe.num_experts)");
      owner[static_cast<size_t>(next)] = static_cast<int32_t>(m);
    }
  }
  for (int64_t m = 0; m < num_modalities; ++m) {
    MOETRON_CHECK(allowed_experts(owner, static_cast<int32_t>(m)) >= top_k,
                  "moe.modality_experts: modality ", m, " may use ",
                  allowed_experts(owner, static_cast<int32_t>(m)),
                  " experts (its own plus the shared ones), fewer than moe.top_k = ", top_k);
  }
  return owner;
}

int64_t allowed_experts(const std::vector<int32_t>& owner, int32_t m) {
  return std::count_if(owner.begin(), owner.end(), [m](int32_t o) { return o < 0 || o == m; });
}

std::vector<int32_t> modality_ids(const Tensor& modality, int64_t tokens, int64_t num_modalities) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens), 0);
  if (!modality.defined()) return ids;
  MOETRON_CHECK(modality.dtype() == DType::i32 && modality.rank() == 1 && modality.dim(0) == tokens,
                "token modality must be i32 [", tokens, "], got ", modality.str());
  const int32_t* p = modality.data<int32_t>();
  for (int64_t i = 0; i < tokens; ++i) {
    MOETRON_CHECK(p[i] >= 0 && p[i] < num_modalities, "token ", i, " has modality ", p[i],
                  ", outside [0, ", num_modalities, ") (moe.num_modalities)");
    ids[static_cast<size_t>(i)] = p[i];
  }
  return ids;
}

void partitioned_router_topk(kernels::Context& ctx, const Tensor& logits, const Tensor& bias,
                             const kernels::RouterArgs& args, const Tensor& modality,
                             int64_t num_modalities, const std::vector<int32_t>& owner,
                             const Tensor& scores, const Tensor& topk_idx,
                             const Tensor& topk_weight) {
  const std::vector<int32_t> mod = modality_ids(modality, logits.dim(0), num_modalities);
  if (logits.dtype() == DType::f64) {
    route_partitioned<double>(ctx, logits, bias, args, mod, owner, scores, topk_idx, topk_weight);
  } else {
    route_partitioned<float>(ctx, logits, bias, args, mod, owner, scores, topk_idx, topk_weight);
  }
}

ModalitySums local_modality_sums(const Tensor& scores, const Tensor& topk_idx,
                                 const Tensor& modality, int64_t num_modalities) {
  const std::vector<int32_t> mod = modality_ids(modality, scores.dim(0), num_modalities);
  return scores.dtype() == DType::f64 ? sums_of<double>(scores, topk_idx, mod, num_modalities)
                                      : sums_of<float>(scores, topk_idx, mod, num_modalities);
}

void reduce_modality_sums(comm::Communicator* group, ModalitySums& s) {
  if (!group || group->size() == 1) return;
  std::vector<std::vector<double>*> parts = {&s.tokens, &s.entropy_sums, &s.counts, &s.score_sums};
  int64_t n = 0;
  for (auto* p : parts) n += static_cast<int64_t>(p->size());
  Tensor buf = Tensor::empty({n}, DType::f64, MemTag::comm);
  double* b = buf.data<double>();
  for (auto* p : parts) b = std::copy(p->begin(), p->end(), b);
  group->allreduce(buf, comm::ReduceOp::sum);
  const double* r = buf.data<double>();
  for (auto* p : parts) {
    std::copy_n(r, p->size(), p->begin());
    r += p->size();
  }
}

ModalityLossValues modality_loss_values(const ModalitySums& s, const std::vector<int32_t>& owner,
                                        int64_t top_k, const ModalityLossConfig& cfg) {
  ModalityLossValues v;
  const int64_t e = s.num_experts;
  double total = 0;
  for (double x : s.tokens) total += x;
  for (int64_t m = 0; m < s.num_modalities; ++m) {
    const double tm = s.tokens[static_cast<size_t>(m)];
    if (tm <= 0) continue;
    if (cfg.aux_coef > 0) {
      double aux = 0;
      for (int64_t j = 0; j < e; ++j) {
        if (!is_allowed(owner, static_cast<int32_t>(m), j)) continue;
        aux += (s.counts[at(m, j, e)] / (tm * static_cast<double>(top_k))) *
               (s.score_sums[at(m, j, e)] / tm);
      }
      const auto em = static_cast<double>(allowed_experts(owner, static_cast<int32_t>(m)));
      v.aux += cfg.aux_coef * (tm / total) * em * aux;
    }
    if (cfg.local_entropy_coef > 0) {
      v.entropy += cfg.local_entropy_coef * s.entropy_sums[static_cast<size_t>(m)] / tm;
    }
    if (cfg.global_entropy_coef > 0) {
      v.entropy += cfg.global_entropy_coef *
                   std::max(0.0, cfg.global_entropy_threshold - entropy_of_mean(s, m));
    }
  }
  return v;
}

void add_modality_loss_gradients(const Tensor& scores, const Tensor& modality,
                                 const ModalitySums& sums, const std::vector<int32_t>& owner,
                                 int64_t top_k, const ModalityLossConfig& cfg, double weight,
                                 const Tensor& d_scores) {
  const std::vector<int32_t> mod = modality_ids(modality, scores.dim(0), sums.num_modalities);
  if (scores.dtype() == DType::f64) {
    add_gradients<double>(scores, mod, sums, owner, top_k, cfg, weight, d_scores);
  } else {
    add_gradients<float>(scores, mod, sums, owner, top_k, cfg, weight, d_scores);
  }
}

AllocationMove adapt_allocation(std::vector<int32_t>& owner, std::span<const double> load,
                                std::span<const double> loss, int64_t num_modalities,
                                const AllocationRule& rule) {
  const auto e = static_cast<int64_t>(owner.size());
  MOETRON_CHECK(static_cast<int64_t>(load.size()) == num_modalities * e,
                "adaptive allocation: load of ", load.size(), " entries for ", num_modalities,
                " modalities x ", e, " experts");
  MOETRON_CHECK(loss.empty() || static_cast<int64_t>(loss.size()) == num_modalities,
                "adaptive allocation: ", loss.size(), " losses for ", num_modalities,
                " modalities");
  std::vector<double> tokens(static_cast<size_t>(num_modalities), 0.0);
  std::vector<int64_t> owned(static_cast<size_t>(num_modalities), 0);
  double total = 0;
  for (int64_t m = 0; m < num_modalities; ++m)
    for (int64_t j = 0; j < e; ++j) tokens[static_cast<size_t>(m)] += load[at(m, j, e)];
  for (double x : tokens) total += x;
  for (int32_t o : owner)
    if (o >= 0) ++owned[static_cast<size_t>(o)];
  AllocationMove move;
  if (total <= 0) return move;
  // phi of an allocation over the modalities with tokens and experts.
  auto phi_of = [&](const std::vector<int64_t>& own, int64_t* hi, int64_t* lo) {
    double qmax = -1, qmin = std::numeric_limits<double>::infinity();
    for (int64_t m = 0; m < num_modalities; ++m) {
      const auto mi = static_cast<size_t>(m);
      if (tokens[mi] <= 0 || own[mi] <= 0) continue;
      const double q =
          (loss.empty() ? 1.0 : loss[mi]) * tokens[mi] / total / static_cast<double>(own[mi]);
      if (q > qmax) qmax = q, *hi = m;
      if (q < qmin) qmin = q, *lo = m;
    }
    return qmax < 0 ? 1.0 : qmax / qmin;
  };
  int64_t hi = -1, lo = -1;
  move.phi_before = phi_of(owned, &hi, &lo);
  move.phi_after = move.phi_before;
  if (hi < 0 || lo < 0 || hi == lo) return move;
  if (owned[static_cast<size_t>(lo)] - 1 < rule.min_experts) return move;
  if (allowed_experts(owner, static_cast<int32_t>(lo)) - 1 < rule.top_k) return move;
  std::vector<int64_t> after = owned;
  --after[static_cast<size_t>(lo)];
  ++after[static_cast<size_t>(hi)];
  int64_t h2 = -1, l2 = -1;
  const double phi_after = phi_of(after, &h2, &l2);
  if (!(phi_after * (1.0 + rule.hysteresis) <= move.phi_before)) return move;
  int64_t pick = -1;
  for (int64_t j = 0; j < e; ++j) {
    if (owner[static_cast<size_t>(j)] != lo) continue;
    if (pick < 0 || load[at(lo, j, e)] < load[at(lo, pick, e)]) pick = j;
  }
  owner[static_cast<size_t>(pick)] = static_cast<int32_t>(hi);
  move.moved = true;
  move.expert = pick;
  move.from = static_cast<int32_t>(lo);
  move.to = static_cast<int32_t>(hi);
  move.phi_after = phi_after;
  return move;
}

}  // namespace moetron::nn
