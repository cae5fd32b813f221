#include "moetron/cli/plan_cmd.h"

#include <omp.h>

#include <iostream>

#include "moetron/cli/plan_search.h"
#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/auto_layout.h"
#include "moetron/train/config_files.h"
#include "moetron/train/plan_config.h"
#include "moetron/train/plan_report.h"

namespace moetron::cli {

CLI::App* add_plan_command(CLI::App& app, PlanCommand& o) {
  auto* cmd = app.add_subcommand("plan",
                                 "print the plan of a config on N ranks (coordinates, groups, "
                                 "stages, buckets, memory) without MPI");
  auto* config =
      cmd->add_option("--config", o.config, "TOML config file (the model, seq_len, global batch)");
  cmd->add_option("--model", o.model,
                  "a preset instead of --config: configs/scale/<model>.toml (mixtral-8x7b, "
                  "mixtral-8x22b, deepseek-v3, switch-c, moe-1.6t, moe-10t)")
      ->excludes(config);
  cmd->add_option("-n,--ranks", o.ranks, "ranks of the job planned (without --cluster)");
  cmd->add_option("--cluster", o.cluster,
                  "search layouts for NODESxDEVICES (e.g. 128x8) with the cost model");
  cmd->add_option("--device", o.device, "hardware profile configs/hardware/<device>.toml");
  cmd->add_option("--top", o.top, "plans printed (search mode)");
  cmd->add_option("--global-batch", o.global_batch, "sequences per step (search mode)");
  cmd->add_option("--seq-len", o.seq_len, "tokens per sequence (search mode)");
  cmd->add_option("--layout", o.layout,
                  "evaluate this layout instead of searching: tp=8,pp=8,dp=16[,ep=..,cp=..,"
                  "vpp=..,mb=..,recompute=none|selective|full,zero1]");
  cmd->add_option("--routing-skew", o.routing_skew,
                  "the busiest expert rank's extra load under ep (search mode)");
  cmd->add_option("--search", o.search,
                  "search mode: exhaustive (every layout), rl (a REINFORCE policy against the "
                  "cost model) or both (rl, and its gap to the exhaustive optimum)")
      ->check(CLI::IsMember({"exhaustive", "rl", "both"}));
  cmd->add_option("--fix", o.fix,
                  "search only layouts with these degrees, e.g. ep=1,pp=1 (dp, tp, pp, ep, cp, "
                  "vpp, mb)");
  cmd->add_flag("--no-dp-overlap", o.no_dp_overlap,
                "model the dp reduction after the pipeline instead of under its last backward");
  cmd->add_flag("--muon", o.muon,
                "for the best plan, Muon's update replicated on every dp rank vs FlexMuon's "
                "owners");
  cmd->add_option("--rl-samples", o.rl_samples, "the rl search's budget of sampled layouts");
  cmd->add_option("--seed", o.seed, "the rl search's random seed");
  cmd->add_option("--set", o.sets, "override a config key: key=value (repeatable)");
  cmd->add_option("--json", o.json_path,
                  "also write the plan as JSON to this file ('-': stdout only)");
  cmd->add_option("--threads", o.threads,
                  "OpenMP threads per rank (kernel scratch in the memory prediction)");
  cmd->add_flag("--no-memory", o.no_memory, "skip the per-rank memory prediction");
  return cmd;
}

int run_plan_command(const PlanCommand& given) {
  MOETRON_CHECK(!given.config.empty() || !given.model.empty(),
                "moetron plan: --config FILE or --model PRESET is required");
  PlanCommand o = given;
  if (!o.model.empty()) o.config = train::find_configs_file("scale", o.model, "--model");
  if (!o.cluster.empty()) return run_plan_search(o);
  MOETRON_CHECK(o.ranks >= 1, "-n must be >= 1, got ", o.ranks);
  std::string chosen;
  const train::Config cfg = train::resolve_auto_layout(train::load_config(o.config, o.sets),
                                                       static_cast<int>(o.ranks), &chosen);
  if (!chosen.empty() && o.json_path != "-") std::cout << chosen << "\n";
  const nn::Precision prec = train::resolve_precision(cfg.train, nullptr);
  const parallel::TrainingPlan plan = train::make_plan(cfg, prec, static_cast<int>(o.ranks));
  train::PlanReportOptions ro;
  ro.threads = o.threads > 0 ? o.threads
                             : (cfg.train.threads > 0 ? cfg.train.threads : omp_get_max_threads());
  ro.memory = !o.no_memory;
  const nlohmann::json j = train::plan_json(cfg, plan, ro);
  if (o.json_path == "-") {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << train::plan_table(j, ro);
  if (plan.settings().stage_balance == parallel::StageBalance::measured && plan.settings().pp > 1) {
    std::cout << "note: parallel.stage_balance = measured: the job times its layers at launch and "
                 "may split "
                 "the stages differently from the FLOP split shown\n";
  }
  if (!o.json_path.empty()) write_file_atomically(o.json_path, j.dump(2) + "\n");
  return 0;
}

}  // namespace moetron::cli
