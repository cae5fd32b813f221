#include "moetron/cli/plan_search.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/planner/layout_rl.h"
#include "moetron/planner/layout_search.h"
#include "moetron/planner/muon_update.h"
#include "moetron/train/auto_layout.h"
#include "moetron/train/config.h"
#include "moetron/train/config_files.h"

namespace moetron::cli {

namespace {

// --device NAME: configs/hardware/NAME.toml; a path to a .toml file as is.
planner::HardwareProfile find_profile(const std::string& device) {
  return planner::load_hardware_profile(train::find_configs_file("hardware", device, "--device"));
}

std::pair<int64_t, int64_t> parse_cluster(const std::string& s) {
  const size_t x = s.find('x');
  try {
    MOETRON_CHECK(x != std::string::npos, "");
    const int64_t nodes = std::stoll(s.substr(0, x)), per = std::stoll(s.substr(x + 1));
    MOETRON_CHECK(nodes > 0 && per > 0, "");
    return {nodes, per};
  } catch (const std::exception&) {
    MOETRON_FAIL("--cluster '", s, "': expected NODESxDEVICES, e.g. 128x8");
  }
}

double gib(double bytes) {
  return bytes / double(1 << 30);
}

nlohmann::json plan_json(const planner::RankedPlan& p) {
  const planner::StepCost& c = p.cost;
  return {{"layout", p.layout.str()},
          {"dp", p.layout.dp},
          {"tp", p.layout.tp},
          {"pp", p.layout.pp},
          {"ep", p.layout.ep},
          {"cp", p.layout.cp},
          {"vpp", p.layout.vpp},
          {"micro_batch", p.layout.micro_batch},
          {"recompute", p.layout.recompute},
          {"zero1", p.layout.zero1},
          {"zero3", p.layout.zero3},
          {"offload", p.layout.offload},
          {"tp_2d", p.layout.tp_2d},
          {"runtime_supports", !p.layout.beyond_runtime()},
          {"host_gib_per_device", gib(c.host_bytes)},
          {"step_s", c.step_s},
          {"tokens_per_s", c.tokens_per_s},
          {"mfu", c.mfu},
          {"tflops_per_device", c.tflops_per_device},
          {"memory_gib_per_device", gib(c.memory_bytes)},
          {"dominant", c.dominant()},
          {"seconds",
           {{"compute", c.compute_s},
            {"bubble", c.bubble_s},
            {"pp", c.pp_comm_s},
            {"tp", c.tp_comm_s},
            {"ep", c.ep_comm_s},
            {"cp", c.cp_comm_s},
            {"dp", c.dp_comm_s},
            {"optimizer", c.optimizer_s},
            {"elementwise", c.elementwise_s}}},
          {"wire_gb_per_device",
           {{"tp", c.tp_bytes / 1e9},
            {"ep", c.ep_bytes / 1e9},
            {"cp", c.cp_bytes / 1e9},
            {"dp", c.dp_bytes / 1e9},
            {"pp", c.pp_bytes / 1e9}}}};
}

void print_plans(const std::vector<planner::RankedPlan>& plans) {
  std::printf("%-4s %-58s %9s %11s %6s %8s %8s  %-9s %s\n", "rank", "layout", "step s", "tokens/s",
              "MFU", "TFLOP/s", "GiB/dev", "dominant", "wire GB/dev tp ep cp dp pp");
  for (size_t i = 0; i < plans.size(); ++i) {
    const planner::StepCost& c = plans[i].cost;
    std::printf("%-4zu %-58s %9.3f %11.4g %5.1f%% %8.1f %8.1f  %-9s %.1f %.1f %.1f %.1f %.2f\n",
                i + 1, plans[i].layout.str().c_str(), c.step_s, c.tokens_per_s, 100 * c.mfu,
                c.tflops_per_device, gib(c.memory_bytes), c.dominant().c_str(), c.tp_bytes / 1e9,
                c.ep_bytes / 1e9, c.cp_bytes / 1e9, c.dp_bytes / 1e9, c.pp_bytes / 1e9);
  }
  if (plans.empty()) return;
  for (const auto& p : plans) {
    if (p.layout.beyond_runtime()) {
      std::printf("(zero3 and offload are planner-only: moetron's trainer runs neither yet)\n");
      break;
    }
  }
  // Why the best one wins: its terms, largest first.
  const planner::StepCost& b = plans.front().cost;
  std::printf(
      "best: compute %.3f s, elementwise %.3f, bubble %.3f, exposed comm tp %.3f ep %.3f cp %.3f "
      "dp %.3f pp %.3f, optimizer %.3f\n",
      b.compute_s, b.elementwise_s, b.bubble_s, b.tp_comm_s, b.ep_comm_s, b.cp_comm_s, b.dp_comm_s,
      b.pp_comm_s, b.optimizer_s);
}

}  // namespace

namespace {

// Why the plan uses 1-D or 2-D tensor parallelism: the best of each in
// the search, their tp time and traffic.
void compare_tp_grids(const planner::SearchResult& r, nlohmann::json& j) {
  if (!r.found_by_tp_grid[0] || !r.found_by_tp_grid[1]) return;
  const planner::RankedPlan* best = r.best_by_tp_grid;
  const planner::StepCost &a = best[0].cost, &b = best[1].cost;
  std::printf(
      "1-D vs 2-D tp: best 1-D %.3f s (tp %.3f s exposed, %.1f GB a device), best 2-D %.3f s "
      "(tp %.3f s, %.1f GB): %s wins by %.1f%%\n",
      a.step_s, a.tp_comm_s, a.tp_bytes / 1e9, b.step_s, b.tp_comm_s, b.tp_bytes / 1e9,
      a.step_s <= b.step_s ? "1-D" : "2-D",
      100 * (std::max(a.step_s, b.step_s) / std::min(a.step_s, b.step_s) - 1));
  // Why: the grid trades activation bytes (its rows) for weight bytes (its columns).
  const double b_act = b.tp_bytes - b.tp_weight_bytes;
  std::printf(
      "  why: 2-D moves %.1f GB of activations along its rows and %.1f GB of weights along its "
      "columns, against 1-D's %.1f GB of activations (%s)\n",
      b_act / 1e9, b.tp_weight_bytes / 1e9, a.tp_bytes / 1e9,
      b.tp_bytes < a.tp_bytes ? "the grid moves fewer bytes"
                              : "the weights the grid moves outweigh the activations it saves");
  j["tp_1d_vs_2d"] = {{"best_1d", best[0].layout.str()},
                      {"best_1d_step_s", a.step_s},
                      {"best_1d_tp_bytes", a.tp_bytes},
                      {"best_2d", best[1].layout.str()},
                      {"best_2d_step_s", b.step_s},
                      {"best_2d_tp_activation_bytes", b_act},
                      {"best_2d_tp_weight_bytes", b.tp_weight_bytes}};
}

// The ranked plans of the search --search names; their statistics go into `j`.
std::vector<planner::RankedPlan> search(const planner::CostModel& model, int64_t devices,
                                        const PlanCommand& o, nlohmann::json& j) {
  const planner::HardwareProfile& hw = model.hardware();
  planner::SearchSpace space;
  if (!o.fix.empty()) space.allow = planner::fixed_degrees(o.fix);
  planner::SearchResult r;
  if (o.search != "rl") {
    r = planner::search_layouts(model, devices, o.top, space);
    std::printf("exhaustive: %lld layouts, %lld fit, in %.3f s\n",
                static_cast<long long>(r.evaluated), static_cast<long long>(r.fit), r.seconds);
    MOETRON_CHECK(r.leanest_bytes > 0, "no layout of ", devices, " devices",
                  o.fix.empty() ? "" : " with --fix " + o.fix,
                  " divides this workload (heads by tp, experts by ep, layers by pp x vpp, the "
                  "global batch by dp x micro-batch)");
    MOETRON_CHECK(!r.plans.empty(), "no layout of ", devices, " ", hw.name,
                  " devices fits this workload: the leanest (", r.leanest.str(), ") needs ",
                  gib(r.leanest_bytes), " GiB per device of ", gib(hw.memory_bytes),
                  " (with ZeRO-3, offload and full recompute in the search)");
    j["exhaustive"] = {{"evaluated", r.evaluated}, {"fit", r.fit}, {"seconds", r.seconds}};
    compare_tp_grids(r, j);
    if (o.search == "exhaustive") return r.plans;
  }
  planner::RlOptions ro;
  ro.max_samples = o.rl_samples;
  ro.seed = o.seed;
  const planner::RlResult rl = planner::rl_search_layouts(model, devices, space, ro);
  std::printf(
      "rl: %lld samples, %lld policy updates, %lld distinct layouts evaluated (%lld more by the "
      "polish), in %.3f s\n",
      static_cast<long long>(rl.samples), static_cast<long long>(rl.updates),
      static_cast<long long>(rl.policy_evaluations),
      static_cast<long long>(rl.evaluations - rl.policy_evaluations), rl.seconds);
  MOETRON_CHECK(rl.found, "the rl search found no layout of ", devices, " ", hw.name,
                " devices that fits this workload in ", rl.samples,
                " samples (--search exhaustive says whether one exists)");
  j["rl"] = {{"samples", rl.samples},
             {"evaluations", rl.evaluations},
             {"policy_evaluations", rl.policy_evaluations},
             {"policy_step_s", rl.policy_step_s},
             {"updates", rl.updates},
             {"seconds", rl.seconds},
             {"seed", o.seed}};
  if (o.search == "both") {
    const double optimum = r.plans.front().cost.step_s;
    const double gap = rl.best.cost.step_s / optimum - 1,
                 policy_gap = rl.policy_step_s / optimum - 1;
    std::printf(
        "rl's best is %+.2f%% of the exhaustive optimum's step time (the policy alone %+.2f%%), "
        "from %.1f%% of its evaluations\n",
        100 * gap, 100 * policy_gap, 100.0 * double(rl.evaluations) / double(r.evaluated));
    j["rl"]["gap_to_exhaustive"] = gap;
    j["rl"]["policy_gap_to_exhaustive"] = policy_gap;
  }
  return {rl.best};
}

}  // namespace

PlanModel plan_cost_model(const PlanCommand& o) {
  const train::Config cfg = train::load_config(o.config, o.sets);
  const auto [nodes, per_node] = parse_cluster(o.cluster);
  planner::HardwareProfile hw = find_profile(o.device);
  hw.devices_per_node = per_node;  // the cluster's shape is what was asked about
  planner::Workload w = train::planner_workload(cfg);
  if (o.seq_len > 0) w.seq_len = o.seq_len;
  if (o.global_batch > 0) w.global_batch = o.global_batch;
  w.routing_skew = o.routing_skew;
  w.dp_overlap = !o.no_dp_overlap;
  PlanModel pm{planner::CostModel(w, hw), nodes * per_node};
  std::printf(
      "%s on %lld x %lld %s (%lld devices): %.3g parameters (%.3g in experts), %lld "
      "sequences x %lld tokens per step\n",
      o.config.c_str(), static_cast<long long>(nodes), static_cast<long long>(per_node),
      hw.name.c_str(), static_cast<long long>(pm.devices),
      pm.model.dense_params() + pm.model.expert_params(), pm.model.expert_params(),
      static_cast<long long>(w.global_batch), static_cast<long long>(w.seq_len));
  return pm;
}

int run_plan_search(const PlanCommand& o) {
  const PlanModel pm = plan_cost_model(o);
  const planner::CostModel& model = pm.model;
  const planner::HardwareProfile& hw = model.hardware();
  const int64_t devices = pm.devices;
  std::vector<planner::RankedPlan> plans;
  nlohmann::json j = {{"config", o.config}, {"cluster", o.cluster}, {"device", hw.name}};
  if (!o.layout.empty()) {
    const planner::LayoutChoice l = planner::parse_layout(o.layout, devices);
    plans.push_back({l, model.predict(l)});
    if (!planner::fits_memory(plans.back().cost, hw))
      std::printf("warning: %.1f GiB per device does not fit %s's %.0f GiB\n",
                  gib(plans.back().cost.memory_bytes), hw.name.c_str(), gib(hw.memory_bytes));
  } else {
    plans = search(model, devices, o, j);
  }
  print_plans(plans);
  if (o.muon && !plans.empty()) {
    const planner::MuonUpdate u = planner::muon_update_seconds(model, plans.front().layout);
    std::printf(
        "Muon update of the best plan (%lld matrices a stage): replicated %.3f s, FlexMuon owner "
        "%.3f s (Newton-Schulz %.3f + gather %.3f): %+.0f%%\n",
        static_cast<long long>(u.matrices), u.replicated_s, u.owner_s(), u.owner_compute_s,
        u.owner_gather_s, 100 * (u.owner_s() / u.replicated_s - 1));
    j["muon_update"] = {{"replicated_s", u.replicated_s},
                        {"owner_s", u.owner_s()},
                        {"owner_newton_schulz_s", u.owner_compute_s},
                        {"owner_gather_s", u.owner_gather_s},
                        {"matrices_per_stage", u.matrices}};
  }
  j["plans"] = nlohmann::json::array();
  for (const auto& p : plans) j["plans"].push_back(plan_json(p));
  if (!o.json_path.empty()) write_file_atomically(o.json_path, j.dump(2) + "\n");
  return 0;
}

}  // namespace moetron::cli
