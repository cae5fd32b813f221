// Shape checks shared by the MoE backends (internal to kernels/): every
// backend rejects the same bad input with the same message, before writing.
#pragma once

#include <string>

#include "moetron/kernels/moe.h"

namespace moetron::kernels::moe_detail {

inline std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : "undefined";
}

inline void check_2d(const Tensor& t, const char* fn, const char* name, int64_t rows,
                     int64_t cols) {
  MOETRON_CHECK(t.defined() && t.rank() == 2 && t.dim(0) == rows && t.dim(1) == cols, fn, ": ",
                name, " must be [", rows, ", ", cols, "], got ", describe(t));
}

// logits [T, E] and the router outputs; returns nothing, throws on mismatch.
inline void check_router(const char* fn, const Tensor& scores, const Tensor& topk_idx,
                         const Tensor& topk_weight, const RouterArgs& args) {
  MOETRON_CHECK(scores.defined() && scores.rank() == 2, fn, ": scores must be [T, E], got ",
                describe(scores));
  const int64_t T = scores.dim(0), E = scores.dim(1);
  MOETRON_CHECK(args.k >= 1 && args.k <= E, fn, ": k = ", args.k, " must be in [1, E = ", E, "]");
  check_2d(topk_idx, fn, "topk_idx", T, args.k);
  MOETRON_CHECK(topk_idx.dtype() == DType::i32, fn, ": topk_idx must be i32, got ", topk_idx.str());
  check_2d(topk_weight, fn, "topk_weight", T, args.k);
  MOETRON_CHECK(topk_weight.dtype() == scores.dtype(), fn, ": topk_weight ", topk_weight.str(),
                " must have the dtype of scores ", scores.str());
}

// A backend's rule for the router's float tensors (the reference takes any
// float dtype, the CPU backend f32 only); throws naming fn and the argument.
using RouterDtypeCheck = void (*)(const Tensor& t, const char* fn, const char* name);

// Every argument of router_topk, with the backend's dtype rule.
inline void check_router_topk_args(const char* fn, RouterDtypeCheck dtype_ok, const Tensor& logits,
                                   const Tensor& bias, const Tensor& scores, const Tensor& topk_idx,
                                   const Tensor& topk_weight, const RouterArgs& args) {
  dtype_ok(logits, fn, "logits");
  MOETRON_CHECK(logits.rank() == 2, fn, ": logits must be [T, E], got ", logits.str());
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_2d(scores, fn, "scores", T, E);
  dtype_ok(scores, fn, "scores");
  check_router(fn, scores, topk_idx, topk_weight, args);
  if (bias.defined()) {
    dtype_ok(bias, fn, "bias");
    MOETRON_CHECK(bias.rank() == 1 && bias.dim(0) == E, fn, ": bias must be [", E, "], got ",
                  bias.str());
  }
}

// Every argument of router_topk_backward, with the backend's dtype rule.
inline void check_router_backward_args(const char* fn, RouterDtypeCheck dtype_ok,
                                       const Tensor& d_topk_weight, const Tensor& d_scores_extra,
                                       const Tensor& scores, const Tensor& topk_idx,
                                       const Tensor& topk_weight, const RouterArgs& args,
                                       const Tensor& d_logits) {
  dtype_ok(scores, fn, "scores");
  check_router(fn, scores, topk_idx, topk_weight, args);
  const int64_t T = scores.dim(0), E = scores.dim(1), K = args.k;
  if (d_topk_weight.defined()) {
    dtype_ok(d_topk_weight, fn, "d_topk_weight");
    check_2d(d_topk_weight, fn, "d_topk_weight", T, K);
  }
  if (d_scores_extra.defined()) {
    dtype_ok(d_scores_extra, fn, "d_scores_extra");
    check_2d(d_scores_extra, fn, "d_scores_extra", T, E);
  }
  dtype_ok(d_logits, fn, "d_logits");
  check_2d(d_logits, fn, "d_logits", T, E);
}

// Checks a plan against its own invariants' sizes (a plan built by moe_plan
// always passes; a hand-made or stale one is caught here).
inline void check_plan(const char* fn, const MoePlan& plan) {
  MOETRON_CHECK(plan.num_experts >= 1 &&
                    static_cast<int64_t>(plan.offsets.size()) == plan.num_experts + 1 &&
                    static_cast<int64_t>(plan.row_of_slot.size()) == plan.num_tokens * plan.top_k &&
                    static_cast<int64_t>(plan.token_of_row.size()) == plan.rows(),
                fn, ": the MoePlan is inconsistent (build it with moe_plan)");
}

// A [T, D] token-major tensor and a [>= rows, D] expert-major one.
inline void check_rows(const char* fn, const MoePlan& plan, const Tensor& tokens,
                       const char* tokens_name, const Tensor& rows, const char* rows_name) {
  check_plan(fn, plan);
  MOETRON_CHECK(tokens.defined() && tokens.rank() == 2 && tokens.dim(0) == plan.num_tokens, fn,
                ": ", tokens_name, " must be [T = ", plan.num_tokens, ", D], got ",
                describe(tokens));
  const int64_t D = tokens.dim(1);
  MOETRON_CHECK(
      rows.defined() && rows.rank() == 2 && rows.dim(0) >= plan.rows() && rows.dim(1) == D, fn,
      ": ", rows_name, " must be [>= ", plan.rows(), ", ", D, "], got ", describe(rows));
  MOETRON_CHECK(rows.dtype() == tokens.dtype(), fn, ": ", rows_name, " ", rows.str(), " and ",
                tokens_name, " ", tokens.str(), " must share a dtype");
}

inline void check_weights(const char* fn, const MoePlan& plan, const Tensor& w, const char* name) {
  check_2d(w, fn, name, plan.num_tokens, plan.top_k);
}

// moe_combine_weight_grad's arguments: rows of act, d_act (and d_expert_out)
// cover the plan, dtypes agree, the weights are [T, K].
inline void check_combine_weight_grad(const char* fn, const MoePlan& plan, const Tensor& act,
                                      const Tensor& topk_weight, const Tensor& d_act,
                                      const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  check_plan(fn, plan);
  MOETRON_CHECK(act.defined() && act.rank() == 2 && act.dim(0) >= plan.rows(), fn,
                ": act must be [>= ", plan.rows(), ", F], got ", describe(act));
  MOETRON_CHECK(d_act.defined() && d_act.shape() == act.shape() && d_act.dtype() == act.dtype(), fn,
                ": d_act must match act ", act.str(), ", got ", describe(d_act));
  if (d_expert_out.defined()) {
    MOETRON_CHECK(d_expert_out.rank() == 2 && d_expert_out.dim(0) >= plan.rows() &&
                      d_expert_out.dtype() == act.dtype(),
                  fn, ": d_expert_out must be [>= ", plan.rows(), ", D] of act's dtype, got ",
                  describe(d_expert_out));
  }
  check_weights(fn, plan, topk_weight, "topk_weight");
  check_weights(fn, plan, d_topk_weight, "d_topk_weight");
}

}  // namespace moetron::kernels::moe_detail
