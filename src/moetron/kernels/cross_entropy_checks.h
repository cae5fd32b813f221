// Argument checks shared by the cross-entropy backends (internal to
// kernels/): same rules, same messages, all run before anything is written.
#pragma once

#include <string>

#include "moetron/kernels/cross_entropy.h"

namespace moetron::kernels::ce_detail {

inline std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : "undefined";
}

inline void check_shape_2d(const Tensor& t, const char* fn, const char* name, int64_t rows,
                           int64_t cols) {
  MOETRON_CHECK(t.defined() && t.rank() == 2 && t.dim(0) == rows && t.dim(1) == cols, fn, ": ",
                name, " must be [", rows, ", ", cols, "], got ", describe(t));
}

// targets i32 [T]; losses [T].
inline void check_target_shapes(const char* fn, const Tensor& targets, const Tensor& losses,
                                int64_t T) {
  MOETRON_CHECK(targets.defined() && targets.rank() == 1 && targets.dim(0) == T &&
                    targets.dtype() == DType::i32,
                fn, ": targets must be i32 [", T, "], got ", describe(targets));
  MOETRON_CHECK(losses.defined() && losses.rank() == 1 && losses.dim(0) == T, fn,
                ": losses must be [", T, "], got ", describe(losses));
}

[[noreturn]] inline void fail_target(const char* fn, int64_t t, int32_t target, int64_t V) {
  MOETRON_FAIL(fn, ": targets[", t, "] = ", target, " is not below the vocab size ", V,
               " (negative targets are ignored)");
}

// The shapes above, and each target < V (a negative target is ignored):
// host tensors (the CUDA backend checks the values on the device).
inline void check_targets(const char* fn, const Tensor& targets, const Tensor& losses, int64_t T,
                          int64_t V) {
  check_target_shapes(fn, targets, losses, T);
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (tg[t] >= V) fail_target(fn, t, tg[t], V);
  }
}

inline void check_logits(const char* fn, const Tensor& logits, const Tensor& dlogits) {
  MOETRON_CHECK(logits.defined() && logits.rank() == 2, fn, ": logits must be [T, V], got ",
                describe(logits));
  if (dlogits.defined()) {
    check_shape_2d(dlogits, fn, "dlogits", logits.dim(0), logits.dim(1));
    MOETRON_CHECK(dlogits.dtype() == logits.dtype(), fn, ": dlogits ", dlogits.str(),
                  " must have the dtype of logits ", logits.str());
  }
}

inline void check_fused(const char* fn, const Tensor& hidden, const Tensor& head_w,
                        int64_t chunk_tokens, const Tensor& d_hidden, const Tensor& d_head_w) {
  MOETRON_CHECK(hidden.defined() && hidden.rank() == 2, fn, ": hidden must be [T, D], got ",
                describe(hidden));
  const int64_t T = hidden.dim(0), D = hidden.dim(1);
  MOETRON_CHECK(head_w.defined() && head_w.rank() == 2 && head_w.dim(1) == D, fn,
                ": head_w must be [V, ", D, "], got ", describe(head_w));
  MOETRON_CHECK(head_w.dtype() == hidden.dtype(), fn, ": head_w ", head_w.str(), " and hidden ",
                hidden.str(), " must share a dtype");
  MOETRON_CHECK(chunk_tokens >= 1, fn, ": chunk_tokens must be >= 1, got ", chunk_tokens);
  if (d_hidden.defined()) {
    check_shape_2d(d_hidden, fn, "d_hidden", T, D);
    MOETRON_CHECK(d_hidden.dtype() == hidden.dtype(), fn, ": d_hidden ", d_hidden.str(),
                  " must have the dtype of hidden ", hidden.str());
  }
  if (d_head_w.defined()) check_shape_2d(d_head_w, fn, "d_head_w", head_w.dim(0), D);
}

}  // namespace moetron::kernels::ce_detail
