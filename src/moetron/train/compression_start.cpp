#include "moetron/train/compression_start.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/core/error.h"

namespace moetron::train {

CompressionStart::CompressionStart(const CompressionStartOptions& o)
    : o_(o),
      window_(static_cast<int64_t>(std::ceil(1.0 / (1.0 - o.beta2) - 1e-9))),
      last_change_(std::numeric_limits<double>::infinity()) {
  MOETRON_CHECK(o.beta2 > 0 && o.beta2 < 1, "compression start: beta2 must be in (0, 1), got ",
                o.beta2);
  MOETRON_CHECK(o.tolerance > 0, "compression start: tolerance must be positive, got ",
                o.tolerance);
}

bool CompressionStart::observe(int64_t step, double grad_norm) {
  if (!std::isfinite(grad_norm)) return false;
  ++seen_;
  ema_ = o_.beta2 * ema_ + (1.0 - o_.beta2) * grad_norm * grad_norm;
  const double corrected = ema_ / (1.0 - std::pow(o_.beta2, static_cast<double>(seen_)));
  history_.push_back(corrected);
  if (static_cast<int64_t>(history_.size()) > window_ + 1) history_.pop_front();
  if (static_cast<int64_t>(history_.size()) <= window_) return false;
  last_change_ = corrected > 0 ? std::fabs(corrected - history_.front()) / corrected
                               : std::numeric_limits<double>::infinity();
  const int64_t earliest = std::max({o_.min_steps, o_.lr_warmup, 2 * window_});
  return step >= earliest && last_change_ <= o_.tolerance;
}

nlohmann::json CompressionStart::to_json() const {
  return {{"ema", ema_},
          {"seen", seen_},
          {"history", std::vector<double>(history_.begin(), history_.end())},
          {"last_change", std::isfinite(last_change_) ? last_change_ : -1.0}};
}

void CompressionStart::from_json(const nlohmann::json& j) {
  ema_ = j.at("ema").get<double>();
  seen_ = j.at("seen").get<int64_t>();
  const auto h = j.at("history").get<std::vector<double>>();
  history_.assign(h.begin(), h.end());
  const double c = j.value("last_change", -1.0);
  last_change_ = c >= 0 ? c : std::numeric_limits<double>::infinity();
}

}  // namespace moetron::train
