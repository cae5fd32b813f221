#include "moetron/train/auto_layout.h"

#include <cstdio>

#include "moetron/core/error.h"
#include "moetron/planner/cost_model.h"
#include "moetron/train/config_files.h"
#include "moetron/train/plan_config.h"

namespace moetron::train {

namespace {

// The planner's layout written into the config's keys.
Config with_layout(Config cfg, const planner::LayoutChoice& l) {
  cfg.parallel.tp = l.tp;
  // A q x q grid (parallel.tp_2d), resolved as load_config would.
  const int64_t q = l.tp_2d ? planner::grid_side(l.tp) : 1;
  cfg.parallel.tp_2d = l.tp_2d ? std::to_string(q) + "x" + std::to_string(q) : "";
  cfg.parallel.tp_rows = q;
  cfg.parallel.pp = l.pp;
  cfg.parallel.vpp = l.vpp;
  cfg.parallel.ep = l.ep;
  cfg.parallel.cp = l.cp;
  cfg.parallel.zero = l.zero1;
  cfg.parallel.sequence_parallel = l.tp > 1 && (l.sequence_parallel || l.tp_2d);
  cfg.parallel.microbatches = 0;  // derived from the global batch
  cfg.train.micro_batch = l.micro_batch;
  cfg.train.grad_accum = 1;
  cfg.recompute.policy = l.recompute;
  return cfg;
}

// Why the trainer refuses `cfg` on world_size ranks; empty when it accepts it.
std::string refusal(const Config& cfg, int world_size) {
  try {
    validate(cfg);
    make_plan(cfg, resolve_precision(cfg.train, nullptr), world_size);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

planner::Workload planner_workload(const Config& cfg) {
  planner::Workload w;
  w.model = cfg.model;
  w.moe = cfg.moe;
  w.seq_len = cfg.train.seq_len;
  w.global_batch = cfg.train.global_batch > 0 ? cfg.train.global_batch
                                              : cfg.train.micro_batch * cfg.train.grad_accum;
  return w;
}

std::string AutoLayout::summary() const {
  const planner::StepCost& c = chosen.cost;
  char line[512];
  std::snprintf(line, sizeof line,
                "parallel.auto: %s (predicted %.3g s/step, %.4g tokens/s, %.1f%% MFU, %.2f GiB per "
                "rank, dominant term %s; the fastest of %lld fitting layouts on %s",
                chosen.layout.str().c_str(), c.step_s, c.tokens_per_s, 100 * c.mfu,
                c.memory_bytes / double(1 << 30), c.dominant().c_str(), static_cast<long long>(fit),
                profile.c_str());
  std::string s = line;
  if (considered > 1) s += ", after " + std::to_string(considered - 1) + " the trainer refused";
  return s + ")";
}

AutoLayout choose_auto_layout(const Config& cfg, int world_size) {
  MOETRON_CHECK(world_size >= 1, "parallel.auto: world size must be >= 1");
  AutoLayout out;
  out.profile = find_configs_file("hardware", cfg.parallel.auto_device, "parallel.auto_device");
  planner::HardwareProfile hw = planner::load_hardware_profile(out.profile);
  hw.devices_per_node = world_size;  // one machine: every rank on the intra link
  const planner::CostModel model(planner_workload(cfg), hw);
  const planner::SearchSpace space = planner::trainer_space();
  const planner::SearchResult r = planner::search_layouts(model, world_size, 1 << 20, space);
  out.fit = r.fit;
  std::string first_refusal;
  for (const planner::RankedPlan& p : r.plans) {
    ++out.considered;
    const Config candidate = with_layout(cfg, p.layout);
    const std::string why = refusal(candidate, world_size);
    if (why.empty()) {
      out.config = candidate;
      out.chosen = p;
      return out;
    }
    if (first_refusal.empty()) first_refusal = p.layout.str() + ": " + why;
  }
  MOETRON_FAIL(
      "parallel.auto: no layout of ", world_size, " ranks both fits ", out.profile,
      "'s memory and is accepted by the trainer (", r.fit, " fit",
      first_refusal.empty() ? std::string() : "; the fastest was refused: " + first_refusal, ")");
}

Config resolve_auto_layout(const Config& cfg, int world_size, std::string* log) {
  if (!cfg.parallel.auto_layout) return cfg;
  const AutoLayout a = choose_auto_layout(cfg, world_size);
  if (log) *log = a.summary();
  return a.config;
}

}  // namespace moetron::train
