// Argument checks shared by the vocabulary-parallel cross-entropy backends
// (internal to kernels/): same rules, same messages, all run before anything
// is written. allow_f64: the reference also takes f64 float tensors.
#pragma once

#include "moetron/kernels/cross_entropy_checks.h"
#include "moetron/kernels/vocab_parallel_ce.h"

namespace moetron::kernels::vpce_detail {

inline void check_float(const char* fn, const Tensor& t, const char* name, bool allow_f64) {
  MOETRON_CHECK(t.defined() && (t.dtype() == DType::f32 || (allow_f64 && t.dtype() == DType::f64)),
                fn, ": ", name, " must be f32", allow_f64 ? " or f64" : "", ", got ",
                ce_detail::describe(t));
}

// logits [C, V] with V >= 1 (a rank owns at least one vocabulary row).
inline void check_logits(const char* fn, const Tensor& logits, bool allow_f64) {
  check_float(fn, logits, "logits", allow_f64);
  MOETRON_CHECK(logits.rank() == 2 && logits.dim(1) >= 1, fn,
                ": logits must be [C, V] with V >= 1, got ", logits.str());
}

inline void check_rows(const char* fn, const Tensor& t, const char* name, int64_t rows,
                       bool allow_f64) {
  check_float(fn, t, name, allow_f64);
  MOETRON_CHECK(t.rank() == 1 && t.dim(0) == rows, fn, ": ", name, " must be [", rows, "], got ",
                t.str());
}

inline void check_stats(const char* fn, const Tensor& stats, int64_t rows, bool allow_f64) {
  check_float(fn, stats, "stats", allow_f64);
  ce_detail::check_shape_2d(stats, fn, "stats", rows, 2);
}

inline void check_targets(const char* fn, const Tensor& targets, int64_t rows) {
  MOETRON_CHECK(targets.defined() && targets.rank() == 1 && targets.dim(0) == rows &&
                    targets.dtype() == DType::i32,
                fn, ": targets must be i32 [", rows, "], got ", ce_detail::describe(targets));
}

inline void check_offset(const char* fn, int64_t offset) {
  MOETRON_CHECK(offset >= 0, fn, ": the slice's vocabulary offset must be >= 0, got ", offset);
}

}  // namespace moetron::kernels::vpce_detail
