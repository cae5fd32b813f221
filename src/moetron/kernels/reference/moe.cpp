// Reference MoE routing and row movement: plain loops in double, the oracle
// for the other backends.
#include <cmath>
#include <vector>

#include "moetron/kernels/moe.h"
#include "moetron/kernels/moe_checks.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

using moe_detail::check_2d;
using moe_detail::describe;

namespace {
void check_float(const Tensor& t, const char* fn, const char* name) {
  MOETRON_CHECK(t.defined() && is_floating(t.dtype()), fn, ": ", name,
                " must be a float tensor, got ", describe(t));
}

// fn(token, slot, row) for every slot (token-major), row < 0 when dropped.
template <typename Fn>
void for_each_slot(const MoePlan& plan, Fn&& fn) {
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    for (int64_t k = 0; k < plan.top_k; ++k) {
      const int64_t slot = t * plan.top_k + k;
      fn(t, slot, static_cast<int64_t>(plan.row_of_slot[static_cast<size_t>(slot)]));
    }
  }
}

// sum_i g[g0 + i] * x[x0 + i] over n values; also writes w * g[g0 + i] to
// dst[dst0 + i] when dst is defined (dst may be g itself: each value is read
// before it is written).
double dot_and_scale(const Tensor& g, int64_t g0, const Tensor& x, int64_t x0, int64_t n, double w,
                     const Tensor& dst, int64_t dst0) {
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = load(g, g0 + i);
    dot += v * load(x, x0 + i);
    if (dst.defined()) store(dst, dst0 + i, w * v);
  }
  return dot;
}
}  // namespace

void router_topk(Context&, const Tensor& logits, const Tensor& bias, const RouterArgs& args,
                 const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_weight) {
  const char* fn = "router_topk";
  moe_detail::check_router_topk_args(fn, check_float, logits, bias, scores, topk_idx, topk_weight,
                                     args);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t K = args.k;
  std::vector<double> s(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
  std::vector<bool> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    double mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, load(logits, t * E + e));
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      const double x = load(logits, t * E + e);
      s[static_cast<size_t>(e)] =
          args.score == RouterScore::softmax ? std::exp(x - mx) : 1.0 / (1.0 + std::exp(-x));
      sum += s[static_cast<size_t>(e)];
    }
    for (int64_t e = 0; e < E; ++e) {
      if (args.score == RouterScore::softmax) s[static_cast<size_t>(e)] /= sum;
      sel[static_cast<size_t>(e)] =
          s[static_cast<size_t>(e)] + (bias.defined() ? load(bias, e) : 0);
      taken[static_cast<size_t>(e)] = false;
      store(scores, t * E + e, s[static_cast<size_t>(e)]);
    }
    // K passes of argmax; strict '>' keeps the lower index on ties.
    std::vector<int64_t> chosen;
    double chosen_sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[static_cast<size_t>(e)]) continue;
        if (best < 0 || sel[static_cast<size_t>(e)] > sel[static_cast<size_t>(best)]) best = e;
      }
      taken[static_cast<size_t>(best)] = true;
      chosen.push_back(best);
      chosen_sum += s[static_cast<size_t>(best)];
    }
    for (int64_t k = 0; k < K; ++k) {
      topk_idx.data<int32_t>()[t * K + k] = static_cast<int32_t>(chosen[static_cast<size_t>(k)]);
      const double w = s[static_cast<size_t>(chosen[static_cast<size_t>(k)])];
      store(topk_weight, t * K + k, args.renormalize ? w / chosen_sum : w);
    }
  }
}

void router_topk_backward(Context&, const Tensor& d_topk_weight, const Tensor& d_scores_extra,
                          const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_weight,
                          const RouterArgs& args, const Tensor& d_logits) {
  const char* fn = "router_topk_backward";
  moe_detail::check_router_backward_args(fn, check_float, d_topk_weight, d_scores_extra, scores,
                                         topk_idx, topk_weight, args, d_logits);
  const int64_t T = scores.dim(0), E = scores.dim(1), K = args.k;
  const std::vector<int64_t> idx = load_ids(topk_idx);
  for (int64_t i = 0; i < T * K; ++i) {
    MOETRON_CHECK(idx[static_cast<size_t>(i)] >= 0 && idx[static_cast<size_t>(i)] < E, fn,
                  ": topk_idx entry ", idx[static_cast<size_t>(i)], " outside [0, ", E, ")");
  }
  std::vector<double> s(static_cast<size_t>(E)), ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      s[static_cast<size_t>(e)] = load(scores, t * E + e);
      ds[static_cast<size_t>(e)] = d_scores_extra.defined() ? load(d_scores_extra, t * E + e) : 0;
    }
    if (d_topk_weight.defined()) {
      // w_k = s_k / S with S = sum_j s_j over the chosen: dS-term is -sum_k g_k w_k / S.
      double chosen_sum = 0, g_dot_w = 0;
      for (int64_t k = 0; k < K; ++k) {
        chosen_sum += s[static_cast<size_t>(idx[static_cast<size_t>(t * K + k)])];
        g_dot_w += load(d_topk_weight, t * K + k) * load(topk_weight, t * K + k);
      }
      for (int64_t k = 0; k < K; ++k) {
        const double g = load(d_topk_weight, t * K + k);
        ds[static_cast<size_t>(idx[static_cast<size_t>(t * K + k)])] +=
            args.renormalize ? (g - g_dot_w) / chosen_sum : g;
      }
    }
    double s_dot_ds = 0;
    for (int64_t e = 0; e < E; ++e)
      s_dot_ds += s[static_cast<size_t>(e)] * ds[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) {
      const double se = s[static_cast<size_t>(e)], g = ds[static_cast<size_t>(e)];
      store(d_logits, t * E + e,
            args.score == RouterScore::softmax ? se * (g - s_dot_ds) : g * se * (1.0 - se));
    }
  }
}

void moe_permute(Context&, const Tensor& x, const MoePlan& plan, const Tensor& permuted) {
  moe_detail::check_rows("moe_permute", plan, x, "x", permuted, "permuted");
  const int64_t D = x.dim(1);
  for (int64_t r = 0; r < plan.rows(); ++r) {
    const int64_t t = plan.token_of_row[static_cast<size_t>(r)];
    for (int64_t d = 0; d < D; ++d) store(permuted, r * D + d, load(x, t * D + d));
  }
}

void moe_permute_backward(Context&, const Tensor& d_permuted, const MoePlan& plan,
                          const Tensor& dx) {
  moe_detail::check_rows("moe_permute_backward", plan, dx, "dx", d_permuted, "d_permuted");
  const int64_t D = dx.dim(1), K = plan.top_k;
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = plan.row_of_slot[static_cast<size_t>(t * K + k)];
        if (r >= 0) acc += load(d_permuted, r * D + d);
      }
      store(dx, t * D + d, acc);
    }
  }
}

void moe_unpermute(Context&, const Tensor& expert_out, const MoePlan& plan,
                   const Tensor& topk_weight, const Tensor& out) {
  const char* fn = "moe_unpermute";
  moe_detail::check_rows(fn, plan, out, "out", expert_out, "expert_out");
  moe_detail::check_weights(fn, plan, topk_weight, "topk_weight");
  const int64_t D = out.dim(1), K = plan.top_k;
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = plan.row_of_slot[static_cast<size_t>(t * K + k)];
        if (r >= 0) acc += load(topk_weight, t * K + k) * load(expert_out, r * D + d);
      }
      store(out, t * D + d, acc);
    }
  }
}

void moe_unpermute_backward(Context&, const Tensor& dout, const Tensor& expert_out,
                            const MoePlan& plan, const Tensor& topk_weight,
                            const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  const char* fn = "moe_unpermute_backward";
  moe_detail::check_rows(fn, plan, dout, "dout", expert_out, "expert_out");
  moe_detail::check_weights(fn, plan, topk_weight, "topk_weight");
  if (d_expert_out.defined()) {
    moe_detail::check_rows(fn, plan, dout, "dout", d_expert_out, "d_expert_out");
  }
  if (d_topk_weight.defined()) moe_detail::check_weights(fn, plan, d_topk_weight, "d_topk_weight");
  const int64_t D = dout.dim(1);
  for_each_slot(plan, [&](int64_t t, int64_t slot, int64_t r) {
    const double dot = r < 0 ? 0.0
                             : dot_and_scale(dout, t * D, expert_out, r * D, D,
                                             load(topk_weight, slot), d_expert_out, r * D);
    if (d_topk_weight.defined()) store(d_topk_weight, slot, dot);
  });
}

void moe_combine_weight_grad(Context&, const Tensor& act, const MoePlan& plan,
                             const Tensor& topk_weight, const Tensor& d_act,
                             const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  moe_detail::check_combine_weight_grad("moe_combine_weight_grad", plan, act, topk_weight, d_act,
                                        d_expert_out, d_topk_weight);
  const int64_t F = act.dim(1);
  const int64_t D = d_expert_out.defined() ? d_expert_out.dim(1) : 0;
  for_each_slot(plan, [&](int64_t, int64_t slot, int64_t r) {
    double dot = 0;
    if (r >= 0) {
      const double w = load(topk_weight, slot);
      dot = dot_and_scale(d_act, r * F, act, r * F, F, w, d_act, r * F);  // in place
      for (int64_t d = 0; d < D; ++d)
        store(d_expert_out, r * D + d, w * load(d_expert_out, r * D + d));
    }
    store(d_topk_weight, slot, dot);
  });
}

}  // namespace moetron::kernels::reference
