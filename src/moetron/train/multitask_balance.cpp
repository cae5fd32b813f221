#include "moetron/train/multitask_balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::train {

namespace {

constexpr double kMinGradNormWeight = 1e-4;
constexpr double kMaxUncertaintyStep = 1.0;

void check_losses(std::span<const double> losses, size_t k, bool positive) {
  MOETRON_CHECK(losses.size() == k, "multitask balancer: ", losses.size(), " losses for ", k,
                " tasks");
  for (size_t i = 0; i < k; ++i) {
    MOETRON_CHECK(std::isfinite(losses[i]) && (positive ? losses[i] > 0 : true),
                  "multitask balancer: loss of task ", i, " is ", losses[i],
                  positive ? " (must be finite and > 0)" : " (must be finite)");
  }
}

}  // namespace

const char* balance_method_name(BalanceMethod m) {
  switch (m) {
    case BalanceMethod::kFixed:
      return "fixed";
    case BalanceMethod::kUncertainty:
      return "uncertainty";
    case BalanceMethod::kGradNorm:
      return "gradnorm";
    case BalanceMethod::kDwa:
      return "dwa";
  }
  return "?";
}

MultitaskBalancer::MultitaskBalancer(MultitaskSettings settings) : settings_(std::move(settings)) {
  const size_t k = settings_.tasks.size();
  if (settings_.weights.empty()) settings_.weights.assign(k, 1.0);
  MOETRON_CHECK(settings_.weights.size() == k, "multitask balancer: ", settings_.weights.size(),
                " weights for ", k, " tasks");
  switch (settings_.method) {
    case BalanceMethod::kFixed:
      weights_ = settings_.weights;
      break;
    case BalanceMethod::kUncertainty:
      log_var_.assign(k, 0.0);
      weights_.assign(k, 1.0);
      break;
    case BalanceMethod::kGradNorm: {
      double sum = std::accumulate(settings_.weights.begin(), settings_.weights.end(), 0.0);
      MOETRON_CHECK(sum > 0, "multitask.weights: all zero");
      weights_.clear();
      for (double w : settings_.weights) weights_.push_back(w * static_cast<double>(k) / sum);
      break;
    }
    case BalanceMethod::kDwa:
      weights_.assign(k, 1.0);
      break;
  }
}

void MultitaskBalancer::update(std::span<const double> losses, std::span<const double> grad_norms) {
  const size_t k = settings_.tasks.size();
  switch (settings_.method) {
    case BalanceMethod::kFixed:
      check_losses(losses, k, false);
      break;
    case BalanceMethod::kUncertainty:
      check_losses(losses, k, false);
      update_uncertainty(losses);
      break;
    case BalanceMethod::kGradNorm:
      check_losses(losses, k, true);
      update_gradnorm(losses, grad_norms);
      break;
    case BalanceMethod::kDwa:
      check_losses(losses, k, true);
      update_dwa(losses);
      break;
  }
  ++steps_;
}

void MultitaskBalancer::update_uncertainty(std::span<const double> losses) {
  for (size_t i = 0; i < log_var_.size(); ++i) {
    // d/ds [exp(-s) L + s] = 1 - exp(-s) L.
    double grad = 1.0 - std::exp(-log_var_[i]) * losses[i];
    double step =
        std::clamp(settings_.uncertainty_lr * grad, -kMaxUncertaintyStep, kMaxUncertaintyStep);
    log_var_[i] -= step;
    weights_[i] = std::exp(-log_var_[i]);
  }
}

void MultitaskBalancer::update_gradnorm(std::span<const double> losses,
                                        std::span<const double> grad_norms) {
  const size_t k = weights_.size();
  MOETRON_CHECK(grad_norms.size() == k, "multitask balancer (gradnorm): ", grad_norms.size(),
                " gradient norms for ", k, " tasks");
  for (size_t i = 0; i < k; ++i) {
    MOETRON_CHECK(std::isfinite(grad_norms[i]) && grad_norms[i] >= 0,
                  "multitask balancer (gradnorm): gradient norm of task ", i, " is ",
                  grad_norms[i]);
  }
  if (initial_loss_.empty()) initial_loss_.assign(losses.begin(), losses.end());
  const double kd = static_cast<double>(k);
  double mean_g = 0, mean_big_g = 0, mean_ratio = 0;
  std::vector<double> big_g(k), ratio(k);
  for (size_t i = 0; i < k; ++i) {
    big_g[i] = weights_[i] * grad_norms[i];
    ratio[i] = losses[i] / initial_loss_[i];
    mean_g += grad_norms[i] / kd;
    mean_big_g += big_g[i] / kd;
    mean_ratio += ratio[i] / kd;
  }
  if (mean_g <= 0) return;  // no gradient signal this step: keep the weights
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    double target = mean_big_g * std::pow(ratio[i] / mean_ratio, settings_.gradnorm_alpha);
    double diff = big_g[i] - target;
    double sign = diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0);
    weights_[i] -= settings_.gradnorm_lr * sign * grad_norms[i] / mean_g;
    weights_[i] = std::max(weights_[i], kMinGradNormWeight);
    sum += weights_[i];
  }
  for (double& w : weights_) w *= kd / sum;
}

void MultitaskBalancer::update_dwa(std::span<const double> losses) {
  prev2_loss_ = prev_loss_;
  prev_loss_.assign(losses.begin(), losses.end());
  if (prev2_loss_.empty()) return;  // weights stay 1 for the first two steps
  const size_t k = weights_.size();
  std::vector<double> e(k);
  double rmax = -INFINITY;
  for (size_t i = 0; i < k; ++i) {
    e[i] = prev_loss_[i] / prev2_loss_[i] / settings_.dwa_temperature;
    rmax = std::max(rmax, e[i]);
  }
  double sum = 0;
  for (double& x : e) sum += (x = std::exp(x - rmax));  // max-shifted: same ratio, no overflow
  for (size_t i = 0; i < k; ++i) weights_[i] = static_cast<double>(k) * e[i] / sum;
}

double MultitaskBalancer::regularizer() const {
  return std::accumulate(log_var_.begin(), log_var_.end(), 0.0);
}

// Layout: steps, then five blocks of K: weights, s_i, L_i(0), L_i(t-1),
// L_i(t-2); followed by three flags saying which loss blocks are set.
std::vector<double> MultitaskBalancer::state() const {
  const size_t k = weights_.size();
  std::vector<double> out;
  out.reserve(4 + 5 * k);
  out.push_back(static_cast<double>(steps_));
  auto put = [&](const std::vector<double>& v) {
    for (size_t i = 0; i < k; ++i) out.push_back(v.empty() ? 0.0 : v[i]);
  };
  put(weights_);
  put(log_var_);
  put(initial_loss_);
  put(prev_loss_);
  put(prev2_loss_);
  out.push_back(initial_loss_.empty() ? 0 : 1);
  out.push_back(prev_loss_.empty() ? 0 : 1);
  out.push_back(prev2_loss_.empty() ? 0 : 1);
  return out;
}

void MultitaskBalancer::load_state(std::span<const double> state) {
  const size_t k = weights_.size();
  MOETRON_CHECK(state.size() == 4 + 5 * k, "multitask balancer state: ", state.size(),
                " values, expected ", 4 + 5 * k, " for ", k, " tasks");
  steps_ = static_cast<int64_t>(state[0]);
  auto block = [&](size_t b) { return state.subspan(1 + b * k, k); };
  auto flag = [&](size_t f) { return state[1 + 5 * k + f] != 0; };
  auto get = [&](std::vector<double>& v, size_t b, bool present) {
    if (present) {
      v.assign(block(b).begin(), block(b).end());
    } else {
      v.clear();
    }
  };
  get(weights_, 0, true);
  get(log_var_, 1, settings_.method == BalanceMethod::kUncertainty);
  get(initial_loss_, 2, flag(0));
  get(prev_loss_, 3, flag(1));
  get(prev2_loss_, 4, flag(2));
}

nlohmann::json MultitaskBalancer::to_json() const {
  return {{"balance", balance_method_name(settings_.method)},
          {"tasks", settings_.tasks},
          {"state", state()}};
}

void MultitaskBalancer::from_json(const nlohmann::json& j) {
  MOETRON_CHECK(j.is_object() && j.contains("state") && j.contains("balance"),
                "multitask balancer state: expected {\"balance\", \"tasks\", \"state\"}");
  const std::string method = j.at("balance").get<std::string>();
  MOETRON_CHECK(method == balance_method_name(settings_.method),
                "multitask balancer state: saved with balance = \"", method,
                "\", configured multitask.balance = \"", balance_method_name(settings_.method),
                "\"");
  MOETRON_CHECK(j.at("tasks").get<std::vector<std::string>>() == settings_.tasks,
                "multitask balancer state: saved tasks differ from multitask.tasks");
  load_state(j.at("state").get<std::vector<double>>());
}

std::string MultitaskBalancer::log_line() const {
  std::ostringstream os;
  os.precision(6);
  os << "balance=" << balance_method_name(settings_.method);
  for (size_t i = 0; i < weights_.size(); ++i) {
    os << " w." << settings_.tasks[i] << "=" << weights_[i];
  }
  return os.str();
}

nlohmann::json MultitaskBalancer::weights_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < weights_.size(); ++i) j[settings_.tasks[i]] = weights_[i];
  return j;
}

}  // namespace moetron::train
