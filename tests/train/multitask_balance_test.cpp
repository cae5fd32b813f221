// Multi-task loss balancing (train/multitask_balance.h): each method against
// hand-computed steps, uncertainty's optimum, GradNorm on a toy problem,
// save/restore, and config errors.
#include "moetron/train/multitask_balance.h"

#include <gtest/gtest.h>

#include <cmath>

#include "moetron/core/error.h"

namespace moetron::train {
namespace {

MultitaskSettings two_tasks(BalanceMethod m) {
  MultitaskSettings s;
  s.tasks = {"a", "b"};
  s.weights = {1, 1};
  s.proportions = {0.5, 0.5};
  s.method = m;
  return s;
}

void expect_weights(const MultitaskBalancer& b, std::vector<double> want, double tol = 1e-12) {
  ASSERT_EQ(b.weights().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(b.weights()[i], want[i], tol) << i;
}

TEST(MultitaskBalance, FixedKeepsTheConfiguredWeights) {
  MultitaskSettings s = two_tasks(BalanceMethod::kFixed);
  s.weights = {2.0, 0.5};
  MultitaskBalancer b(s);
  expect_weights(b, {2.0, 0.5});
  b.update(std::vector<double>{3.0, 1.0});
  b.update(std::vector<double>{1.0, 7.0});
  expect_weights(b, {2.0, 0.5});
  EXPECT_EQ(b.regularizer(), 0.0);
  EXPECT_EQ(b.log_line(), "balance=fixed w.a=2 w.b=0.5");
}

TEST(MultitaskBalance, UncertaintyStepsByHand) {
  MultitaskSettings s = two_tasks(BalanceMethod::kUncertainty);
  s.uncertainty_lr = 0.1;
  MultitaskBalancer b(s);
  expect_weights(b, {1, 1});
  // s -= 0.1 (1 - exp(-s) L), w = exp(-s); losses (2, 0.5).
  b.update(std::vector<double>{2.0, 0.5});
  expect_weights(b, {0.9048374180359595, 1.0512710963760241});
  b.update(std::vector<double>{2.0, 0.5});
  expect_weights(b, {0.8344624919648215, 1.1023413802303044});
  EXPECT_NEAR(b.regularizer(), -std::log(0.8344624919648215) - std::log(1.1023413802303044), 1e-12);
}

TEST(MultitaskBalance, UncertaintyConvergesToLogLoss) {
  MultitaskSettings s = two_tasks(BalanceMethod::kUncertainty);
  s.tasks = {"a", "b", "c"};
  s.weights = {1, 1, 1};
  s.uncertainty_lr = 0.5;
  MultitaskBalancer b(s);
  const std::vector<double> losses = {3.0, 0.2, 40.0};
  for (int t = 0; t < 200; ++t) b.update(losses);
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(b.log_variances()[i], std::log(losses[i]), 1e-9) << i;
    EXPECT_NEAR(b.weights()[i], 1.0 / losses[i], 1e-9) << i;
  }
}

TEST(MultitaskBalance, GradNormStepsByHand) {
  MultitaskSettings s = two_tasks(BalanceMethod::kGradNorm);
  s.gradnorm_alpha = 1.0;
  s.gradnorm_lr = 0.1;
  MultitaskBalancer b(s);
  ASSERT_TRUE(b.needs_grad_norms());
  // Step 1: ratios equal, G = (1, 3), target = (2, 2): w += 0.1 * (1, -3) / 2, renormalised.
  b.update(std::vector<double>{4.0, 1.0}, std::vector<double>{1.0, 3.0});
  expect_weights(b, {1.105263157894737, 0.8947368421052632});
  b.update(std::vector<double>{2.0, 0.8}, std::vector<double>{1.0, 3.0});
  expect_weights(b, {1.21606648199446, 0.7839335180055401});
  EXPECT_THROW(b.update(std::vector<double>{2.0, 0.8}), Error);  // norms missing
}

TEST(MultitaskBalance, GradNormStartsFromTheConfiguredWeightsSummingToK) {
  MultitaskSettings s = two_tasks(BalanceMethod::kGradNorm);
  s.weights = {3.0, 1.0};
  MultitaskBalancer b(s);
  expect_weights(b, {1.5, 0.5});
}

// Two tasks with private parameters p_i and losses L_i = c_i p_i^2 / 2, task
// b's gradient 10x task a's; plain gradient descent on sum w_i L_i. With
// fixed weights b's relative loss falls far faster; GradNorm equalises the
// relative training rates L_i(t) / L_i(0).
double relative_rate_gap(BalanceMethod m, int steps) {
  MultitaskSettings s = two_tasks(m);
  s.gradnorm_alpha = 1.5;
  s.gradnorm_lr = 0.02;
  MultitaskBalancer b(s);
  const double c[2] = {1.0, 10.0}, lr = 0.004;
  double p[2] = {1.0, 1.0}, l0[2] = {0.5 * c[0], 0.5 * c[1]};
  double loss[2] = {0, 0};
  for (int t = 0; t < steps; ++t) {
    std::vector<double> losses(2), norms(2);
    for (int i = 0; i < 2; ++i) {
      loss[i] = losses[i] = 0.5 * c[i] * p[i] * p[i];
      norms[i] = c[i] * std::abs(p[i]);
    }
    std::vector<double> w = b.weights();
    for (int i = 0; i < 2; ++i) p[i] -= lr * w[i] * c[i] * p[i];
    b.update(losses, norms);
  }
  return std::abs(std::log((loss[0] / l0[0]) / (loss[1] / l0[1])));
}

TEST(MultitaskBalance, GradNormEqualisesRelativeTrainingRates) {
  double fixed_gap = relative_rate_gap(BalanceMethod::kFixed, 400);
  double gradnorm_gap = relative_rate_gap(BalanceMethod::kGradNorm, 400);
  EXPECT_GT(fixed_gap, std::log(100.0));
  EXPECT_LT(gradnorm_gap, std::log(1.2)) << "fixed gap " << fixed_gap;
}

TEST(MultitaskBalance, DwaFormula) {
  MultitaskSettings s = two_tasks(BalanceMethod::kDwa);
  s.dwa_temperature = 2.0;
  MultitaskBalancer b(s);
  b.update(std::vector<double>{1.0, 1.0});
  expect_weights(b, {1, 1});
  b.update(std::vector<double>{0.5, 0.9});
  // r = (0.5, 0.9): w = 2 exp(r / 2) / sum exp(r / 2).
  expect_weights(b, {0.900332005375044, 1.099667994624956});
  b.update(std::vector<double>{0.5, 0.45});  // r = (1, 0.5)
  double ea = std::exp(0.5), eb = std::exp(0.25);
  expect_weights(b, {2 * ea / (ea + eb), 2 * eb / (ea + eb)});
}

void expect_resume_identical(BalanceMethod m) {
  MultitaskSettings s = two_tasks(m);
  s.tasks = {"x", "y", "z"};
  s.weights = {1, 2, 3};
  auto losses_at = [](int t) {
    return std::vector<double>{1.0 + 0.5 * std::sin(t), 2.0 / (1 + t), 0.3 + 0.01 * t};
  };
  auto norms_at = [](int t) { return std::vector<double>{0.1 * t + 1, 5.0, 2.0 + std::cos(t)}; };
  MultitaskBalancer full(s), first(s);
  for (int t = 0; t < 5; ++t) {
    full.update(losses_at(t), norms_at(t));
    first.update(losses_at(t), norms_at(t));
  }
  MultitaskBalancer resumed(s), resumed_json(s);
  resumed.load_state(first.state());
  resumed_json.from_json(nlohmann::json::parse(first.to_json().dump()));
  for (int t = 5; t < 12; ++t) {
    full.update(losses_at(t), norms_at(t));
    resumed.update(losses_at(t), norms_at(t));
    resumed_json.update(losses_at(t), norms_at(t));
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(full.weights()[i], resumed.weights()[i]) << balance_method_name(m) << t;
      EXPECT_EQ(full.weights()[i], resumed_json.weights()[i]) << balance_method_name(m) << t;
    }
  }
  EXPECT_EQ(full.steps(), resumed.steps());
}

TEST(MultitaskBalance, SaveRestoreGivesIdenticalWeights) {
  for (BalanceMethod m : {BalanceMethod::kFixed, BalanceMethod::kUncertainty,
                          BalanceMethod::kGradNorm, BalanceMethod::kDwa}) {
    expect_resume_identical(m);
  }
  MultitaskBalancer b(two_tasks(BalanceMethod::kDwa));
  EXPECT_THROW(b.load_state(std::vector<double>{1.0, 2.0}), Error);
  MultitaskBalancer g(two_tasks(BalanceMethod::kGradNorm));
  EXPECT_THROW(g.from_json(b.to_json()), Error);  // saved by another method
}

TEST(MultitaskBalance, RejectsBadLosses) {
  MultitaskBalancer d(two_tasks(BalanceMethod::kDwa));
  EXPECT_THROW(d.update(std::vector<double>{1.0}), Error);
  EXPECT_THROW(d.update(std::vector<double>{1.0, 0.0}), Error);
  MultitaskBalancer u(two_tasks(BalanceMethod::kUncertainty));
  EXPECT_THROW(u.update(std::vector<double>{1.0, NAN}), Error);
}

}  // namespace
}  // namespace moetron::train
