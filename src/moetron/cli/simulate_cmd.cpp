#include "moetron/cli/simulate_cmd.h"

#include <cstdio>

#include "moetron/cli/plan_search.h"
#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/planner/layout_search.h"
#include "moetron/planner/step_timeline.h"
#include "moetron/train/config_files.h"

namespace moetron::cli {

CLI::App* add_simulate_command(CLI::App& app, SimulateCommand& o) {
  auto* cmd = app.add_subcommand(
      "simulate",
      "one step of a plan on a cluster as a per-stage timeline (Chrome trace / Perfetto JSON)");
  PlanCommand& p = o.plan;
  auto* config = cmd->add_option("--config", p.config, "TOML config file");
  cmd->add_option("--model", p.model, "a preset instead of --config: configs/scale/<model>.toml")
      ->excludes(config);
  cmd->add_option("--cluster", p.cluster, "NODESxDEVICES, e.g. 128x8")->required();
  cmd->add_option("--device", p.device, "hardware profile configs/hardware/<device>.toml");
  cmd->add_option("--layout", p.layout,
                  "simulate this layout (tp=8,pp=8,...) instead of the search's best");
  cmd->add_option("--global-batch", p.global_batch, "sequences per step");
  cmd->add_option("--seq-len", p.seq_len, "tokens per sequence");
  cmd->add_option("--routing-skew", p.routing_skew, "the busiest expert rank's extra load");
  cmd->add_option("--fix", p.fix, "simulate the best layout with these degrees (ep=1,pp=1)");
  cmd->add_flag("--no-dp-overlap", p.no_dp_overlap,
                "the dp reduction after the pipeline instead of under its last backward");
  cmd->add_option("--set", p.sets, "override a config key: key=value (repeatable)");
  cmd->add_option("--trace", o.trace_path, "write the Chrome trace JSON here")->required();
  return cmd;
}

int run_simulate_command(const SimulateCommand& given) {
  MOETRON_CHECK(!given.plan.config.empty() || !given.plan.model.empty(),
                "moetron simulate: --config FILE or --model PRESET is required");
  SimulateCommand o = given;
  if (!o.plan.model.empty())
    o.plan.config = train::find_configs_file("scale", o.plan.model, "--model");
  const PlanModel pm = plan_cost_model(o.plan);
  planner::LayoutChoice layout;
  if (!o.plan.layout.empty()) {
    layout = planner::parse_layout(o.plan.layout, pm.devices);
  } else {
    planner::SearchSpace space;
    if (!o.plan.fix.empty()) space.allow = planner::fixed_degrees(o.plan.fix);
    const planner::SearchResult r = planner::search_layouts(pm.model, pm.devices, 1, space);
    MOETRON_CHECK(!r.plans.empty(), "no layout of ", pm.devices, " devices fits this workload ",
                  "(moetron plan --cluster says what the leanest needs)");
    layout = r.plans.front().layout;
  }
  const planner::StepTimeline t = planner::simulate_step(pm.model, layout);
  const planner::StepCost& c = t.cost;
  write_file_atomically(
      o.trace_path, planner::chrome_trace(
                        t, o.plan.config + " on " + o.plan.cluster + " " + pm.model.hardware().name)
                            .dump() +
                        "\n");
  std::printf("%s: %lld micro-batches per dp rank over %lld stages\n", layout.str().c_str(),
              static_cast<long long>(t.microbatches), static_cast<long long>(layout.pp));
  std::printf(
      "step %.4f s (timeline %.4f s): stage 0 computes %.4f s, elementwise %.4f, tp %.4f, ep "
      "%.4f, cp %.4f, pp %.4f, bubble %.4f; dp reduction %.4f (%.4f exposed), optimizer %.4f\n",
      c.step_s, t.end_s, t.total("compute"), t.total("elementwise"), t.total("tp"),
      t.total("ep all-to-all"), t.total("cp ring (exposed)"), t.total("pp send"), t.total("bubble"),
      c.dp_reduce_s, c.dp_comm_s, c.optimizer_s);
  std::printf(
      "%.4g tokens/s, %.1f%% MFU; trace: %s (open in https://ui.perfetto.dev or "
      "chrome://tracing)\n",
      c.tokens_per_s, 100 * c.mfu, o.trace_path.c_str());
  return 0;
}

}  // namespace moetron::cli
