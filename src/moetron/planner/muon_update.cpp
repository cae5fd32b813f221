#include "moetron/planner/muon_update.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <vector>

namespace moetron::planner {

namespace {

// The busiest of n owners when `costs` are dealt largest first onto the
// least loaded (LPT).
double busiest_owner(std::vector<double> costs, int64_t n) {
  std::sort(costs.begin(), costs.end(), std::greater<>());
  std::priority_queue<double, std::vector<double>, std::greater<>> load;
  for (int64_t i = 0; i < n; ++i) load.push(0.0);
  for (const double c : costs) {
    const double least = load.top();
    load.pop();
    load.push(least + c);
  }
  double most = 0;
  while (!load.empty()) {
    most = std::max(most, load.top());
    load.pop();
  }
  return most;
}

}  // namespace

MuonUpdate muon_update_seconds(const CostModel& model, const LayoutChoice& l, int steps) {
  const Workload& w = model.workload();
  const auto ns = [&](double r, double c) {
    const double a = std::min(r, c), b = std::max(r, c);
    return static_cast<double>(steps) * (4 * a * a * b + 2 * a * a * a) / model.gemm_rate(a);
  };
  const double d = static_cast<double>(w.model.d_model);
  const double hd = static_cast<double>(w.model.resolved_head_dim());
  const double q = static_cast<double>(w.model.n_heads) * hd;
  const double kv = static_cast<double>(w.model.n_kv_heads) * hd;
  const double eh = static_cast<double>(w.moe.expert_hidden);
  const double sh = static_cast<double>(w.moe.shared_expert_hidden > 0 ? w.moe.shared_expert_hidden
                                                                       : w.moe.expert_hidden);
  std::vector<double> dense, experts;  // Newton-Schulz seconds per matrix of one stage
  double expert_params = 0, dense_params = 0;
  const int64_t first = 0, last = w.model.n_layers / l.pp;  // stage 0's layers
  for (int64_t i = first; i < last; ++i) {
    for (const auto& [r, c] :
         {std::pair{d, q}, std::pair{d, kv}, std::pair{d, kv}, std::pair{q, d}}) {
      dense.push_back(ns(r, c));
      dense_params += r * c;
    }
    if (nn::layer_is_moe(w.moe, i)) {
      const int64_t local = w.moe.num_experts / l.ep;
      for (int64_t e = 0; e < 3 * local; ++e) experts.push_back(ns(d, eh));
      expert_params += static_cast<double>(3 * local) * d * eh;
      for (int64_t e = 0; e < 3 * w.moe.shared_experts; ++e) dense.push_back(ns(d, sh));
      dense_params += static_cast<double>(3 * w.moe.shared_experts) * d * sh;
    } else {
      const double f = static_cast<double>(w.model.ffn_hidden);
      for (int k = 0; k < 3; ++k) dense.push_back(ns(d, f));
      dense_params += 3 * d * f;
    }
  }
  MuonUpdate u;
  u.matrices = static_cast<int64_t>(dense.size() + experts.size());
  for (const double s : dense) u.replicated_s += s;
  for (const double s : experts) u.replicated_s += s;
  const int64_t dense_group = l.dp * l.cp, expert_group = l.dp * l.cp * l.tp / l.ep;
  u.owner_compute_s = busiest_owner(dense, dense_group) + busiest_owner(experts, expert_group);
  // The bf16 working copies (a tp rank's block of the dense ones) gathered
  // from their owners: half an all-reduce over each group.
  const auto gather = [](double params, int64_t n, const Link& link) {
    return params > 0 ? allgather_seconds(params * 2, n, link) : 0.0;
  };
  u.owner_gather_s =
      gather(dense_params / static_cast<double>(l.tp), dense_group, model.link(dense_group, l.tp)) +
      gather(expert_params, expert_group, model.link(expert_group, l.ep));
  return u;
}

}  // namespace moetron::planner
