#include "moetron/cli/memory_cmd.h"

#include <omp.h>

#include <fstream>
#include <iostream>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/memory_report.h"
#include "moetron/train/trainer.h"

namespace moetron::cli {

CLI::App* add_memory_command(CLI::App& app, MemoryCommand& o) {
  auto* cmd = app.add_subcommand("memory",
                                 "predict per-rank peak memory per tag without running the model");
  cmd->add_option("--config", o.config, "TOML config file")->required();
  cmd->add_option("--set", o.sets, "override a config key: key=value (repeatable)");
  cmd->add_option(
      "--policies", o.policies,
      "recompute policies to compare, comma-separated, or 'all' (default: the config's)");
  cmd->add_option("--json", o.json_path,
                  "also write the prediction as JSON to this file ('-': stdout only)");
  cmd->add_option("--memory-budget", o.budget,
                  "budget per rank, e.g. 24GiB (default: train.memory_budget)");
  cmd->add_option(
      "--dp", o.dp,
      "data-parallel ranks (the job has dp x parallel.tp x parallel.pp ranks; tp, ep, pp, vpp, "
      "sequence_parallel and zero come from the config's [parallel])");
  cmd->add_flag(
      "--zero1", o.zero1,
      "split the optimizer state over the data-parallel ranks (ZeRO-1; or parallel.zero = true)");
  cmd->add_option("--stage", o.stage,
                  "pipeline stage to predict (default: the one with the largest peak)");
  cmd->add_option("--threads", o.threads, "OpenMP threads per rank (kernel scratch)");
  return cmd;
}

int run_memory_command(const MemoryCommand& o) {
  std::vector<std::string> sets = o.sets;
  if (!o.budget.empty()) sets.push_back("train.memory_budget=" + o.budget);
  const train::Config cfg = train::load_config(o.config, sets);
  MOETRON_CHECK(o.dp >= 1, "--dp must be >= 1, got ", o.dp);
  planner::Layout layout =
      train::layout_of(cfg, o.dp * cfg.parallel.cp * cfg.parallel.tp * cfg.parallel.pp, 0);
  layout.zero1 = layout.zero1 || o.zero1;
  MOETRON_CHECK(o.stage >= -1 && o.stage < layout.pp,
                "--stage must be in 0 .. parallel.pp - 1 = ", layout.pp - 1, ", got ", o.stage);
  const nn::Precision prec = train::resolve_precision(cfg.train, nullptr);
  const int64_t threads = o.threads > 0
                              ? o.threads
                              : (cfg.train.threads > 0 ? cfg.train.threads : omp_get_max_threads());
  std::vector<std::string> policies;
  if (o.policies == "all") {
    policies = {"none", "selective", "full", "sqrt"};
    if (cfg.parallel.pp > 1) {
      policies = {"none", "selective"};  // full and sqrt keep segments pipeline stages do not
      std::cout << "parallel.pp = " << cfg.parallel.pp << ": recompute policies none and selective "
                << "(full and sqrt are not available under pipeline parallelism)\n";
    }
  } else if (!o.policies.empty()) {
    policies = train::split_list(o.policies);
  } else {
    policies = {cfg.recompute.policy};
  }
  const int64_t budget = train::memory_budget_bytes(cfg);
  std::vector<train::MemoryRow> rows;
  nlohmann::json fits = nlohmann::json::array();
  for (const auto& p : policies) {
    train::Config c = cfg;
    c.recompute.policy = p;
    if (p != "custom" && p != cfg.recompute.policy) c.recompute.modules.clear();
    if (p != "sqrt") c.recompute.segment = 0;
    planner::MemoryInputs in = train::memory_inputs(c, prec, threads, layout);
    if (o.stage >= 0) in.layout.stage = o.stage;
    rows.push_back({nn::describe(in.recompute), o.stage >= 0 ? planner::estimate_memory(in)
                                                             : planner::estimate_worst_stage(in)});
    fits.push_back(planner::largest_fitting_micro_batch(in, budget));
  }
  nlohmann::json j = {
      {"config", o.config},
      {"precision", std::string(dtype_name(prec.compute))},
      {"grad_dtype", cfg.train.grad_dtype},
      {"moment_dtype", cfg.optim.moment_dtype},
      {"master_dtype", cfg.optim.master_dtype},
      {"micro_batch", cfg.train.micro_batch},
      {"seq_len", cfg.train.seq_len},
      {"grad_accum", cfg.train.grad_accum},
      {"layout",
       {{"dp", layout.dp},
        {"zero1", layout.zero1},
        {"tp", layout.tp},
        {"sequence_parallel", layout.sequence_parallel},
        {"ep", layout.ep},
        {"pp", layout.pp},
        {"vpp", layout.vpp},
        {"schedule", layout.schedule},
        {"stage", o.stage >= 0 ? nlohmann::json(o.stage) : nlohmann::json("largest")}}},
      {"threads", threads},
      {"budget_bytes", budget},
      {"per_rank", train::memory_json(rows)}};
  for (size_t i = 0; i < rows.size(); ++i) j["per_rank"][i]["largest_micro_batch"] = fits[i];
  if (o.json_path == "-") {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "predicted peak per rank: "
            << train::describe_precision(train::memory_inputs(cfg, prec, threads, layout))
            << ", micro-batch " << cfg.train.micro_batch << " x " << cfg.train.seq_len
            << " tokens, grad_accum " << cfg.train.grad_accum << ", " << train::describe([&] {
                 planner::Layout shown = layout;
                 shown.stage = o.stage;
                 return shown;
               }())
            << (layout.pp > 1 && o.stage < 0 ? " (the stage with the largest peak)" : "") << ", "
            << threads << " threads\n"
            << train::memory_table(rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::cout << "largest micro-batch within " << planner::format_bytes(budget) << " under "
              << rows[i].label << ": " << fits[i].get<int64_t>() << "\n";
  }
  // Renamed into place: a failed write leaves no partial file.
  if (!o.json_path.empty()) write_file_atomically(o.json_path, j.dump(2) + "\n");
  return 0;
}

}  // namespace moetron::cli
