#include "moetron/planner/layout_rl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <unordered_map>

#include "moetron/core/error.h"

namespace moetron::planner {

namespace {

// Reward of a layout the workload rejects: below any layout that divides
// (a fitting layout at 0.25% MFU scores log(0.0025) = -6).
constexpr double kMisfitReward = -8;

enum Decision {
  kTp,
  kTp2d,
  kCp,
  kPp,
  kEp,
  kVpp,
  kMicroBatch,
  kRecompute,
  kZero,
  kOffload,
  kDecisions
};

// One softmax per decision over its values (as indices into `values`).
struct Policy {
  std::vector<int64_t> values[kDecisions];
  std::vector<double> logits[kDecisions];
};

Policy make_policy(const CostModel& model, int64_t devices, const SearchSpace& space) {
  Policy p;
  const int64_t per_node = model.hardware().devices_per_node;
  const bool grids = std::find(space.tp_2d.begin(), space.tp_2d.end(), true) != space.tp_2d.end();
  for (const int64_t t : divisors(devices)) {
    // 1-D within a node; a q x q grid (2-D) with its rows in one.
    if (t <= per_node || (grids && grid_side(t) >= 2 && grid_side(t) <= per_node))
      p.values[kTp].push_back(t);
  }
  for (const bool two : space.tp_2d) p.values[kTp2d].push_back(two ? 1 : 0);
  for (const int64_t c : divisors(devices)) {
    if (c <= space.max_cp) p.values[kCp].push_back(c);
  }
  p.values[kPp] = divisors(devices);
  const int64_t experts = model.workload().moe.num_experts;
  p.values[kEp] = experts > 0 ? divisors(experts) : std::vector<int64_t>{1};
  p.values[kVpp] = space.vpps;
  p.values[kMicroBatch] = space.micro_batches;
  for (size_t i = 0; i < space.recompute.size(); ++i)
    p.values[kRecompute].push_back(static_cast<int64_t>(i));
  for (const int z : space.zero) p.values[kZero].push_back(z);
  for (const bool o : space.offload) p.values[kOffload].push_back(o ? 1 : 0);
  for (int d = 0; d < kDecisions; ++d) {
    MOETRON_CHECK(!p.values[d].empty(), "rl search: decision ", d, " has no values");
    p.logits[d].assign(p.values[d].size(), 0.0);
  }
  return p;
}

// A sampled layout: the index chosen per decision and the masks it was drawn under.
struct Sample {
  int chosen[kDecisions] = {};
  std::vector<bool> mask[kDecisions];
  double reward = 0;
};

// The values of decision d still allowed given what earlier decisions left
// of the cluster (tp, cp and pp must divide it).
std::vector<bool> allowed(const Policy& p, int d, int64_t left) {
  std::vector<bool> m(p.values[d].size(), true);
  if (d == kTp || d == kCp || d == kPp) {
    for (size_t i = 0; i < m.size(); ++i) m[i] = left % p.values[d][i] == 0;
  }
  return m;
}

std::vector<double> masked_softmax(const std::vector<double>& logits, const std::vector<bool>& m) {
  double top = -1e300;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (m[i]) top = std::max(top, logits[i]);
  }
  std::vector<double> prob(logits.size(), 0.0);
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (m[i]) sum += prob[i] = std::exp(logits[i] - top);
  }
  for (double& x : prob) x /= sum;
  return prob;
}

Sample draw(const Policy& p, int64_t devices, std::mt19937_64& rng) {
  Sample s;
  int64_t left = devices;
  for (int d = 0; d < kDecisions; ++d) {
    s.mask[d] = allowed(p, d, left);
    const std::vector<double> prob = masked_softmax(p.logits[d], s.mask[d]);
    std::discrete_distribution<int> pick(prob.begin(), prob.end());
    s.chosen[d] = pick(rng);
    if (d == kTp || d == kCp || d == kPp) left /= p.values[d][static_cast<size_t>(s.chosen[d])];
  }
  return s;
}

LayoutChoice layout_of(const Policy& p, const Sample& s, int64_t devices,
                       const SearchSpace& space) {
  auto v = [&](int d) { return p.values[d][static_cast<size_t>(s.chosen[d])]; };
  LayoutChoice l;
  l.tp = v(kTp);
  l.tp_2d = v(kTp2d) != 0;
  l.cp = v(kCp);
  l.pp = v(kPp);
  l.dp = devices / (l.tp * l.cp * l.pp);
  l.ep = v(kEp);
  l.vpp = v(kVpp);
  l.micro_batch = v(kMicroBatch);
  l.recompute = space.recompute[static_cast<size_t>(v(kRecompute))];
  l.zero1 = v(kZero) >= 1;
  l.zero3 = v(kZero) >= 3;
  l.offload = v(kOffload) != 0;
  return l;
}

// One REINFORCE step: logits += lr x mean(advantage x d log pi), with the
// batch's mean reward as baseline and advantages scaled to unit spread.
void update(Policy& p, const std::vector<Sample>& batch, double lr) {
  double mean = 0, var = 0;
  if (batch.size() < 2) return;
  for (const Sample& s : batch) mean += s.reward;
  mean /= static_cast<double>(batch.size());
  for (const Sample& s : batch) var += (s.reward - mean) * (s.reward - mean);
  const double spread = std::sqrt(var / static_cast<double>(batch.size()));
  if (spread < 1e-12) return;  // every sample scored alike: no direction
  for (int d = 0; d < kDecisions; ++d) {
    std::vector<double> grad(p.logits[d].size(), 0.0);
    for (const Sample& s : batch) {
      const double a = (s.reward - mean) / spread;
      const std::vector<double> prob = masked_softmax(p.logits[d], s.mask[d]);
      for (size_t i = 0; i < grad.size(); ++i) {
        const double hit = static_cast<int>(i) == s.chosen[d] ? 1.0 : 0.0;
        grad[i] += a * (hit - prob[i]);
      }
    }
    for (size_t i = 0; i < grad.size(); ++i)
      p.logits[d][i] += lr * grad[i] / static_cast<double>(batch.size());
  }
}

// Every distinct layout's reward, evaluated once; the best fitting one so far.
class Evaluator {
 public:
  Evaluator(const CostModel& model, const SearchSpace& space, RlResult& out)
      : model_(model), space_(space), out_(out) {}
  // The reward of `l` (see the header); true in `fresh` when it was new.
  double reward(const LayoutChoice& l, bool& fresh) {
    const auto [it, added] = seen_.try_emplace(l.str(), kMisfitReward);
    fresh = added;
    if (!added) return it->second;
    ++out_.evaluations;
    if ((space_.allow && !space_.allow(l)) || !model_.misfit(l).empty()) return it->second;
    const StepCost c = model_.estimate(l);
    if (!fits_memory(c, model_.hardware())) {
      const double over = c.memory_bytes / memory_budget(model_.hardware());
      return it->second = std::log(c.mfu) - 1 - 2 * std::log(over);
    }
    if (!out_.found || c.step_s < out_.best.cost.step_s) out_.best = {l, c};
    out_.found = true;
    return it->second = std::log(c.mfu);
  }

 private:
  const CostModel& model_;
  const SearchSpace& space_;
  RlResult& out_;
  std::unordered_map<std::string, double> seen_;
};

// Whether a sample's tp x cp x pp divides the cluster.
bool covers(const Policy& p, const Sample& s, int64_t devices) {
  int64_t split = 1;
  for (const int d : {kTp, kCp, kPp}) split *= p.values[d][static_cast<size_t>(s.chosen[d])];
  return devices % split == 0;
}

// Local search from the policy's best: every layout that differs in one or
// two decisions (dp following), taking the fastest fitting one, until a
// sweep finds nothing faster. Catches what a policy of independent
// decisions misses where two interact (moving a factor of 2 from cp to tp,
// say). A sweep costs about (values of all decisions)^2 / 2 evaluations.
void polish(const Policy& p, int64_t devices, const SearchSpace& space, Evaluator& eval,
            Sample best_sample, RlResult& out) {
  bool improved = out.found;
  while (improved) {
    improved = false;
    const Sample centre = best_sample;
    auto try_sample = [&](const Sample& s) {
      if (!covers(p, s, devices)) return;
      const double before = out.best.cost.step_s;
      bool fresh = false;
      eval.reward(layout_of(p, s, devices, space), fresh);
      if (out.best.cost.step_s < before) {
        best_sample = s;
        improved = true;
      }
    };
    for (int d1 = 0; d1 < kDecisions; ++d1) {
      for (size_t i = 0; i < p.values[d1].size(); ++i) {
        Sample s = centre;
        s.chosen[d1] = static_cast<int>(i);
        try_sample(s);
        for (int d2 = d1 + 1; d2 < kDecisions; ++d2) {
          for (size_t k = 0; k < p.values[d2].size(); ++k) {
            Sample t = s;
            t.chosen[d2] = static_cast<int>(k);
            try_sample(t);
          }
        }
      }
    }
  }
}

}  // namespace

RlResult rl_search_layouts(const CostModel& model, int64_t devices, const SearchSpace& space,
                           const RlOptions& o) {
  MOETRON_CHECK(o.batch >= 2 && o.max_samples >= o.batch && o.patience >= 1,
                "rl search: batch >= 2, max_samples >= batch and patience >= 1");
  const auto t0 = std::chrono::steady_clock::now();
  Policy policy = make_policy(model, devices, space);
  std::mt19937_64 rng(o.seed);
  RlResult out;
  Evaluator eval(model, space, out);
  Sample best_sample;
  int64_t stale = 0;
  auto budget_left = [&] {
    return out.samples < o.max_samples &&
           (o.max_evaluations <= 0 || out.evaluations < o.max_evaluations);
  };
  while (budget_left() && stale < o.patience) {
    std::vector<Sample> batch;
    bool any_fresh = false;
    for (int64_t b = 0; b < o.batch && budget_left(); ++b) {
      Sample s = draw(policy, devices, rng);
      const double before = out.found ? out.best.cost.step_s : 0;
      bool fresh = false;
      s.reward = eval.reward(layout_of(policy, s, devices, space), fresh);
      if (out.found && out.best.cost.step_s != before) best_sample = s;
      any_fresh = any_fresh || fresh;
      batch.push_back(std::move(s));
      ++out.samples;
    }
    update(policy, batch, o.learning_rate);
    ++out.updates;
    out.best_by_update.push_back(out.found ? out.best.cost.step_s : 0.0);
    stale = any_fresh ? 0 : stale + 1;
  }
  out.policy_evaluations = out.evaluations;
  out.policy_step_s = out.found ? out.best.cost.step_s : 0;
  if (o.polish) polish(policy, devices, space, eval, best_sample, out);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace moetron::planner
