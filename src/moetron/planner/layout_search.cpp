#include "moetron/planner/layout_search.h"

#include <algorithm>
#include <chrono>

#include "moetron/core/error.h"

namespace moetron::planner {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= n; ++k) {
    if (n % k == 0) out.push_back(k);
  }
  return out;
}

std::function<bool(const LayoutChoice&)> fixed_degrees(const std::string& text) {
  std::vector<std::pair<std::string, int64_t>> fixed;
  for (const std::string& item : layout_items(text)) {
    const size_t eq = item.find('=');
    MOETRON_CHECK(eq != std::string::npos, "--fix: '", item, "' is not key=value");
    const std::string k = item.substr(0, eq);
    MOETRON_CHECK(k == "dp" || k == "tp" || k == "pp" || k == "ep" || k == "cp" || k == "vpp" ||
                      k == "mb" || k == "tp2d",
                  "--fix: unknown key '", k, "' (dp, tp, pp, ep, cp, vpp, mb, tp2d)");
    try {
      fixed.emplace_back(k, std::stoll(item.substr(eq + 1)));
    } catch (const std::exception&) {
      MOETRON_FAIL("--fix: '", item, "': the value is not a number");
    }
  }
  return [fixed](const LayoutChoice& l) {
    for (const auto& [k, v] : fixed) {
      const int64_t have = k == "dp"     ? l.dp
                           : k == "tp"   ? l.tp
                           : k == "pp"   ? l.pp
                           : k == "ep"   ? l.ep
                           : k == "cp"   ? l.cp
                           : k == "vpp"  ? l.vpp
                           : k == "tp2d" ? (l.tp_2d ? 1 : 0)
                                         : l.micro_batch;
      if (have != v) return false;
    }
    return true;
  };
}

namespace {

// Every option of `space` for one split of the cluster (dp, tp, pp, cp, ep
// given in `base`): evaluated, kept when it fits.
void search_options(const CostModel& model, const SearchSpace& space, const LayoutChoice& base,
                    SearchResult& out) {
  for (const int64_t vpp : space.vpps) {
    for (const int64_t mb : space.micro_batches) {
      for (const auto& rc : space.recompute) {
        for (const int zero : space.zero) {
          for (const bool off : space.offload) {
            for (const bool two : space.tp_2d) {
              LayoutChoice l = base;
              l.vpp = vpp;
              l.micro_batch = mb;
              l.recompute = rc;
              l.zero1 = zero >= 1;
              l.zero3 = zero >= 3;
              l.offload = off;
              l.tp_2d = two;
              ++out.evaluated;
              if ((space.allow && !space.allow(l)) || !model.misfit(l).empty()) continue;
              const StepCost c = model.estimate(l);
              if (out.leanest_bytes == 0 || c.memory_bytes < out.leanest_bytes) {
                out.leanest = l;
                out.leanest_bytes = c.memory_bytes;
              }
              if (!fits_memory(c, model.hardware())) continue;
              ++out.fit;
              RankedPlan& best = out.best_by_tp_grid[two ? 1 : 0];
              if (!out.found_by_tp_grid[two ? 1 : 0] || c.step_s < best.cost.step_s) best = {l, c};
              out.found_by_tp_grid[two ? 1 : 0] = true;
              out.plans.push_back({l, c});
            }
          }
        }
      }
    }
  }
}

}  // namespace

SearchSpace trainer_space() {
  SearchSpace space;
  space.micro_batches = {1, 2, 4, 8, 16};
  space.vpps = {1, 2};
  space.zero = {0, 1};
  space.offload = {false};
  space.tp_2d = {false, true};  // parallel.tp_2d = "qxq"
  return space;
}

SearchResult search_layouts(const CostModel& model, int64_t devices, int64_t top,
                            const SearchSpace& space) {
  const auto t0 = std::chrono::steady_clock::now();
  const Workload& w = model.workload();
  const int64_t per_node = model.hardware().devices_per_node;
  const bool grids = std::find(space.tp_2d.begin(), space.tp_2d.end(), true) != space.tp_2d.end();
  SearchResult out;
  std::vector<int64_t> eps = {1};
  if (w.moe.num_experts > 0) eps = divisors(w.moe.num_experts);
  for (const int64_t tp : divisors(devices)) {
    // 1-D tp stays on the node's links; a 2-D grid keeps its rows there.
    if (tp > per_node && !(grids && grid_side(tp) >= 2 && grid_side(tp) <= per_node)) continue;
    for (const int64_t cp : divisors(devices / tp)) {
      if (cp > space.max_cp) break;
      for (const int64_t pp : divisors(devices / (tp * cp))) {
        for (const int64_t ep : eps) {
          LayoutChoice base;
          base.dp = devices / (tp * cp * pp);
          base.tp = tp;
          base.pp = pp;
          base.ep = ep;
          base.cp = cp;
          search_options(model, space, base, out);
        }
      }
    }
  }
  // Stable: among equal predictions the first enumerated (no ZeRO-1, less
  // recompute, smaller degrees) stays first.
  std::stable_sort(
      out.plans.begin(), out.plans.end(),
      [](const RankedPlan& a, const RankedPlan& b) { return a.cost.step_s < b.cost.step_s; });
  if (static_cast<int64_t>(out.plans.size()) > top) out.plans.resize(static_cast<size_t>(top));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace moetron::planner
