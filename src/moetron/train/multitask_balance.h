// Multi-task loss balancing: the per-task weights w_i of the training loss
// sum_i w_i L_i, chosen by `[multitask] balance`:
//
//   fixed        w_i = the configured `weights`.
//   uncertainty  Kendall, Gal & Cipolla 2018. One learnable scalar per task,
//                s_i = log sigma_i^2, and the objective sum_i exp(-s_i) L_i + s_i.
//                We use this one form for every task (regression and
//                cross-entropy alike): it is the regression form
//                1/(2 sigma^2) L + log sigma times 2, and Kendall's
//                classification form exp(-s) L + s/2 only moves the optimum
//                to s = log(2L), i.e. scales every weight by the same 1/2.
//                One form keeps tasks of different kinds on one scale. For
//                fixed losses the optimum is s_i = log L_i (weight 1/L_i),
//                where the curvature exp(-s_i) L_i is exactly 1 whatever the
//                loss scale, so plain SGD on s_i with `uncertainty_lr` in
//                (0, 2) converges linearly; each step is clipped to +-1 so a
//                first huge loss cannot throw s_i far. Effective weight
//                w_i = exp(-s_i); s_i start at 0 (w_i = 1).
//   gradnorm     Chen et al. 2018. Weights start at the configured `weights`
//                renormalised to sum K (the number of tasks). Each step, from
//                the unweighted per-task gradient norms g_i of the shared
//                representation: G_i = w_i g_i, r_i = (L_i / L_i(0)) / mean_j
//                (L_j / L_j(0)), target_i = mean(G) r_i^alpha (a constant),
//                and w_i -= gradnorm_lr * d/dw_i [sum_j |G_j - target_j| /
//                mean(g)] = gradnorm_lr * sign(G_i - target_i) g_i / mean(g).
//                Dividing by mean(g) (a constant) makes the step size a
//                weight unit, independent of the gradients' scale. Then
//                w_i = max(w_i, 1e-4) and renormalised to sum K.
//   dwa          Liu, Johns & Davison 2019. w_i = K exp(r_i / T) / sum_j
//                exp(r_j / T), r_i = L_i(t-1) / L_i(t-2), T the temperature;
//                w_i = 1 for the first two steps.
//
// Use: every optimizer step the trainer weights the task losses with
// weights(), runs backward, then calls update() with the step's per-task
// mean (unweighted) losses and, for gradnorm, the gradient norms; weights()
// then holds the weights of the next step. state()/load_state() carry
// everything update() depends on, so a resumed run continues bit-exactly.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace moetron::train {

enum class BalanceMethod { kFixed, kUncertainty, kGradNorm, kDwa };

// "fixed", "uncertainty", "gradnorm", "dwa".
const char* balance_method_name(BalanceMethod m);

struct MultitaskSettings {
  std::vector<std::string> tasks;   // empty: no [multitask] section (one task)
  std::vector<double> weights;      // fixed weights (gradnorm's start), >= 0, one per task
  std::vector<double> proportions;  // share of each batch drawn from each task, sums to 1
  BalanceMethod method = BalanceMethod::kFixed;
  double gradnorm_alpha = 1.5;
  double gradnorm_lr = 0.025;
  double dwa_temperature = 2.0;
  double uncertainty_lr = 0.01;

  bool enabled() const { return !tasks.empty(); }
};

class MultitaskBalancer {
 public:
  explicit MultitaskBalancer(MultitaskSettings settings);

  const MultitaskSettings& settings() const { return settings_; }
  int num_tasks() const { return static_cast<int>(settings_.tasks.size()); }
  // Whether update() needs the per-task gradient norms.
  bool needs_grad_norms() const { return settings_.method == BalanceMethod::kGradNorm; }
  // Weights of the step about to run: one per task, in settings().tasks order.
  const std::vector<double>& weights() const { return weights_; }
  // Optimizer steps seen by update().
  int64_t steps() const { return steps_; }

  // After a step: per-task mean unweighted losses (finite, > 0 for gradnorm
  // and dwa, which divide by them) and, when needs_grad_norms(), per-task
  // unweighted gradient norms (finite, >= 0). Updates weights().
  void update(std::span<const double> losses, std::span<const double> grad_norms = {});

  // The part of the objective that does not multiply a loss: sum_i s_i for
  // uncertainty, 0 otherwise (the logged total is sum w_i L_i + this).
  double regularizer() const;
  // uncertainty's s_i (empty for other methods).
  const std::vector<double>& log_variances() const { return log_var_; }

  // Everything update() depends on, as doubles; load_state() of it makes a
  // balancer of the same settings continue identically. Throws on a size
  // that does not fit the settings.
  std::vector<double> state() const;
  void load_state(std::span<const double> state);
  // The same with names, for trainer.json.
  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& j);

  // One line per step: "balance=gradnorm w.caption=0.91 w.ocr=1.09 ...".
  std::string log_line() const;
  // {"task": weight, ...} for a JSON step record.
  nlohmann::json weights_json() const;

 private:
  void update_uncertainty(std::span<const double> losses);
  void update_gradnorm(std::span<const double> losses, std::span<const double> grad_norms);
  void update_dwa(std::span<const double> losses);

  MultitaskSettings settings_;
  std::vector<double> weights_;
  std::vector<double> log_var_;       // uncertainty: s_i
  std::vector<double> initial_loss_;  // gradnorm: L_i(0)
  std::vector<double> prev_loss_;     // dwa: L_i(t-1)
  std::vector<double> prev2_loss_;    // dwa: L_i(t-2)
  int64_t steps_ = 0;
};

}  // namespace moetron::train
