// Reference vocabulary-parallel cross-entropy steps: plain loops in double,
// each result rounded once into its tensor, the oracle for the CPU backend.
#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/kernels/reference/ref_util.h"
#include "moetron/kernels/vocab_parallel_ce.h"
#include "moetron/kernels/vocab_parallel_ce_checks.h"

namespace moetron::kernels::reference {

namespace {

// The column of target t in the slice [offset, offset + V), or -1 when t is
// ignored (< 0) or another rank's.
int64_t local_column(int64_t t, int64_t offset, int64_t V) {
  return t >= 0 && t >= offset && t < offset + V ? t - offset : -1;
}

}  // namespace

void vocab_parallel_ce_max(Context&, const Tensor& logits, const Tensor& row_max) {
  const char* fn = "vocab_parallel_ce_max";
  vpce_detail::check_logits(fn, logits, true);
  const int64_t C = logits.dim(0), V = logits.dim(1);
  vpce_detail::check_rows(fn, row_max, "row_max", C, true);
  for (int64_t i = 0; i < C; ++i) {
    double m = -INFINITY;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, load(logits, i * V + j));
    store(row_max, i, m);
  }
}

void vocab_parallel_ce_exp_sum(Context&, const Tensor& logits, const Tensor& row_max,
                               const Tensor& targets, int64_t offset, const Tensor& stats) {
  const char* fn = "vocab_parallel_ce_exp_sum";
  vpce_detail::check_logits(fn, logits, true);
  const int64_t C = logits.dim(0), V = logits.dim(1);
  vpce_detail::check_rows(fn, row_max, "row_max", C, true);
  vpce_detail::check_targets(fn, targets, C);
  vpce_detail::check_offset(fn, offset);
  vpce_detail::check_stats(fn, stats, C, true);
  const std::vector<int64_t> tg = load_ids(targets);
  for (int64_t i = 0; i < C; ++i) {
    const double m = load(row_max, i);
    const int64_t local = local_column(tg[static_cast<size_t>(i)], offset, V);
    store(stats, 2 * i + 1, local >= 0 ? load(logits, i * V + local) - m : 0.0);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double e = std::exp(load(logits, i * V + j) - m);
      store(logits, i * V + j, e);
      sum += e;
    }
    store(stats, 2 * i, sum);
  }
}

void vocab_parallel_ce_loss(Context&, const Tensor& stats, const Tensor& targets,
                            const Tensor& losses) {
  const char* fn = "vocab_parallel_ce_loss";
  MOETRON_CHECK(stats.defined() && stats.rank() == 2, fn, ": stats must be [C, 2], got ",
                ce_detail::describe(stats));
  const int64_t C = stats.dim(0);
  vpce_detail::check_stats(fn, stats, C, true);
  vpce_detail::check_targets(fn, targets, C);
  vpce_detail::check_rows(fn, losses, "losses", C, true);
  const std::vector<int64_t> tg = load_ids(targets);
  for (int64_t i = 0; i < C; ++i) {
    const bool ignored = tg[static_cast<size_t>(i)] < 0;
    store(losses, i, ignored ? 0.0 : std::log(load(stats, 2 * i)) - load(stats, 2 * i + 1));
  }
}

void vocab_parallel_ce_grad(Context&, const Tensor& exps, const Tensor& stats,
                            const Tensor& targets, int64_t offset, float grad_scale) {
  const char* fn = "vocab_parallel_ce_grad";
  vpce_detail::check_logits(fn, exps, true);
  const int64_t C = exps.dim(0), V = exps.dim(1);
  vpce_detail::check_stats(fn, stats, C, true);
  vpce_detail::check_targets(fn, targets, C);
  vpce_detail::check_offset(fn, offset);
  const std::vector<int64_t> tg = load_ids(targets);
  for (int64_t i = 0; i < C; ++i) {
    const int64_t t = tg[static_cast<size_t>(i)];
    const double sum = load(stats, 2 * i);
    const int64_t local = local_column(t, offset, V);
    for (int64_t j = 0; j < V; ++j) {
      double g = 0;
      if (t >= 0) g = grad_scale * load(exps, i * V + j) / sum - (j == local ? grad_scale : 0.0);
      store(exps, i * V + j, g);
    }
  }
}

}  // namespace moetron::kernels::reference
