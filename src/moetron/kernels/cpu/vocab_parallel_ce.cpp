// CPU vocabulary-parallel cross-entropy steps. Plain scalar loops, one row
// per thread, in the order nn/vocab_parallel_ce.cpp ran them before they
// moved here (max_element; exp then a running float sum; one division per
// row for the gradient): the losses and gradients keep their bits, and do
// not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/vocab_parallel_ce.h"
#include "moetron/kernels/vocab_parallel_ce_checks.h"

namespace moetron::kernels::cpu {

namespace {

// Rows x vocabulary worth waking the pool for.
constexpr int64_t kParallelElements = 16384;

// The column of target t in the slice [offset, offset + V), or -1 when t is
// ignored (< 0) or another rank's.
int64_t local_column(int32_t t, int64_t offset, int64_t V) {
  const int64_t local = static_cast<int64_t>(t) - offset;
  return t >= 0 && local >= 0 && local < V ? local : -1;
}

}  // namespace

void vocab_parallel_ce_max(Context&, const Tensor& logits, const Tensor& row_max) {
  const char* fn = "vocab_parallel_ce_max";
  vpce_detail::check_logits(fn, logits, false);
  const int64_t C = logits.dim(0), V = logits.dim(1);
  vpce_detail::check_rows(fn, row_max, "row_max", C, false);
  const float* lg = ptr<float>(logits);
  float* mx = ptr<float>(row_max);
#pragma omp parallel for schedule(static) if (C * V > kParallelElements)
  for (int64_t i = 0; i < C; ++i) mx[i] = *std::max_element(lg + i * V, lg + (i + 1) * V);
}

void vocab_parallel_ce_exp_sum(Context&, const Tensor& logits, const Tensor& row_max,
                               const Tensor& targets, int64_t offset, const Tensor& stats) {
  const char* fn = "vocab_parallel_ce_exp_sum";
  vpce_detail::check_logits(fn, logits, false);
  const int64_t C = logits.dim(0), V = logits.dim(1);
  vpce_detail::check_rows(fn, row_max, "row_max", C, false);
  vpce_detail::check_targets(fn, targets, C);
  vpce_detail::check_offset(fn, offset);
  vpce_detail::check_stats(fn, stats, C, false);
  float* lg = ptr<float>(logits);
  const float* mx = ptr<float>(row_max);
  const int32_t* tg = ptr<int32_t>(targets);
  float* st = ptr<float>(stats);
#pragma omp parallel for schedule(static) if (C * V > kParallelElements)
  for (int64_t i = 0; i < C; ++i) {
    const float m = mx[i];
    float* row = lg + i * V;
    const int64_t local = local_column(tg[i], offset, V);
    st[2 * i + 1] = local >= 0 ? row[local] - m : 0.0f;
    float s = 0;
    for (int64_t j = 0; j < V; ++j) {
      row[j] = std::exp(row[j] - m);
      s += row[j];
    }
    st[2 * i] = s;
  }
}

void vocab_parallel_ce_loss(Context&, const Tensor& stats, const Tensor& targets,
                            const Tensor& losses) {
  const char* fn = "vocab_parallel_ce_loss";
  MOETRON_CHECK(stats.defined() && stats.rank() == 2, fn, ": stats must be [C, 2], got ",
                ce_detail::describe(stats));
  const int64_t C = stats.dim(0);
  vpce_detail::check_stats(fn, stats, C, false);
  vpce_detail::check_targets(fn, targets, C);
  vpce_detail::check_rows(fn, losses, "losses", C, false);
  const float* st = ptr<float>(stats);
  const int32_t* tg = ptr<int32_t>(targets);
  float* loss = ptr<float>(losses);
  // log(sum exp(l - m)) - (l_target - m): C logs, not worth a parallel region.
  for (int64_t i = 0; i < C; ++i) loss[i] = tg[i] < 0 ? 0.0f : std::log(st[2 * i]) - st[2 * i + 1];
}

void vocab_parallel_ce_grad(Context&, const Tensor& exps, const Tensor& stats,
                            const Tensor& targets, int64_t offset, float grad_scale) {
  const char* fn = "vocab_parallel_ce_grad";
  vpce_detail::check_logits(fn, exps, false);
  const int64_t C = exps.dim(0), V = exps.dim(1);
  vpce_detail::check_stats(fn, stats, C, false);
  vpce_detail::check_targets(fn, targets, C);
  vpce_detail::check_offset(fn, offset);
  float* ex = ptr<float>(exps);
  const float* st = ptr<float>(stats);
  const int32_t* tg = ptr<int32_t>(targets);
#pragma omp parallel for schedule(static) if (C * V > kParallelElements)
  for (int64_t i = 0; i < C; ++i) {
    float* row = ex + i * V;
    if (tg[i] < 0) {
      std::fill(row, row + V, 0.0f);
      continue;
    }
    const float inv = grad_scale / st[2 * i];
    for (int64_t j = 0; j < V; ++j) row[j] *= inv;
    const int64_t local = local_column(tg[i], offset, V);
    if (local >= 0) row[local] -= grad_scale;
  }
}

}  // namespace moetron::kernels::cpu
