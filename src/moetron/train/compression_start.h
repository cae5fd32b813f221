// When gradient compression's uncompressed warm-up ends, decided from the
// run itself (parallel.compression_start = "auto") instead of a hand-tuned
// step count.
//
// Why a warm-up at all: 1-bit compressors (sign, sparse_sign) with error
// feedback are exact only in the long run's sum, so the optimizer must be
// linear in the gradients once they start: AdamW's second moment is frozen
// then (parallel.freeze_variance, 1-bit Adam). Freezing it while the
// gradients' scale still moves fast leaves every later step with a stale
// preconditioner, so compression waits until that scale has settled.
//
// The rule, on the global gradient norm of each uncompressed step (already
// computed for clipping; the same on every rank, so every rank switches at
// the same step): s_t = the bias-corrected EMA of ||g_t||^2 with AdamW's
// beta2 (what the second moment averages, summed over all coordinates), and
// W = ceil(1 / (1 - beta2)) steps (its time constant). Compression starts
// after step t when
//     t >= max(min_steps, lr_warmup_steps, 2 W)  and  |s_t - s_{t-W}| <= tol * s_t,
// i.e. the second moment's total changed by at most tol over its own time
// constant. Skipped steps (non-finite gradients) are not observed.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

namespace moetron::train {

struct CompressionStartOptions {
  double beta2 = 0.95;     // AdamW's (optim.beta2)
  double tolerance = 0.1;  // parallel.compression_start_tolerance
  int64_t min_steps = 0;   // parallel.compression_warmup
  int64_t lr_warmup = 0;   // optim.warmup_steps
};

class CompressionStart {
 public:
  explicit CompressionStart(const CompressionStartOptions& o);

  // Step `step`'s global gradient norm (before clipping). True when
  // compression starts with the next step.
  bool observe(int64_t step, double grad_norm);
  // |s_t - s_{t-W}| / s_t at the last observation (inf until W + 1 seen).
  double last_change() const { return last_change_; }
  int64_t window() const { return window_; }

  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& j);

 private:
  CompressionStartOptions o_;
  int64_t window_;
  double ema_ = 0;
  int64_t seen_ = 0;
  std::deque<double> history_;  // bias-corrected s of the last W + 1 observations
  double last_change_;
};

}  // namespace moetron::train
