#include "moetron/cli/train_cmd.h"

#include <iostream>

#include "moetron/cli/plan_cmd.h"
#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/train/auto_layout.h"
#include "moetron/train/fault_injection.h"
#include "moetron/train/heartbeat.h"
#include "moetron/train/trainer.h"

namespace moetron::cli {

namespace {

int train_ranks(const TrainCommand& o) {
  // Under mpirun / srun every rank joins the MPI world first, so that any
  // later error can abort the whole job.
  std::shared_ptr<comm::Communicator> world;
  if (comm::detect_launch_env().under_mpi) world = comm::make_mpi_world();
  train::start_heartbeats(world ? world->rank() : 0);  // for `launch` (train/heartbeat.h)
  train::maybe_inject_failure(world ? world->rank() : 0, 0);
  std::string chosen;
  const train::Config cfg = train::resolve_auto_layout(train::load_config(o.config, o.sets),
                                                       world ? world->size() : 1, &chosen);
  if (!chosen.empty() && (!world || world->rank() == 0)) std::cout << chosen << std::endl;
  train::ResumeOptions ro;
  ro.resume = o.resume;
  ro.fresh_if_all_corrupt = o.allow_fresh_start;
  ro.allow_config_change = o.allow_config_change;
  train::Trainer trainer(cfg, o.out, ro, world);
  const train::TrainResult r = trainer.run();
  if (world && world->rank() != 0) return 0;  // rank 0 reports for the job
  if (r.steps_done == 0) {
    std::cout << "nothing to train: the run in " << o.out
              << " has already reached train.steps = " << cfg.train.steps << "\n";
    return 0;
  }
  std::cout << "trained " << r.steps_done << " steps: loss " << r.first_loss << " -> "
            << r.last_loss << ", validation loss " << r.val_loss << " (" << r.skipped_steps
            << " skipped steps";
  if (r.loss_spikes > 0) std::cout << ", " << r.loss_spikes << " loss spikes";
  if (r.metrics_write_failures > 0)
    std::cout << ", " << r.metrics_write_failures << " metrics lines lost";
  std::cout << "); run in " << o.out << "\n";
  return 0;
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainCommand& o) {
  auto* train = app.add_subcommand("train", "train a model from a TOML config");
  train->add_option("--config", o.config, "TOML config file")->required();
  train->add_option("--out", o.out,
                    "run directory (metrics, checkpoints); required unless --dry-run");
  train->add_option("--set", o.sets, "override a config key: key=value (repeatable)");
  train->add_flag("--resume", o.resume,
                  "continue from the latest complete checkpoint in --out (none yet: start one)");
  train->add_flag("--allow-fresh-start", o.allow_fresh_start,
                  "with --resume: if every checkpoint is damaged, set them aside (.corrupt) and "
                  "train from step 0 instead of stopping");
  train
      ->add_option("--allow-config-change", o.allow_config_change,
                   "with --resume: model/routing keys that may differ from the checkpoint's "
                   "(comma-separated, e.g. moe.top_k,moe.router_score)")
      ->delimiter(',');
  train->add_flag("--dry-run", o.dry_run,
                  "print the plan for -n ranks (as `moetron plan`) and train nothing");
  train->add_option("-n,--ranks", o.ranks, "ranks planned by --dry-run");
  return train;
}

int run_train_command(const TrainCommand& o) {
  if (o.dry_run) {
    PlanCommand p;
    p.config = o.config;
    p.sets = o.sets;
    p.ranks = o.ranks;
    return run_plan_command(p);
  }
  MOETRON_CHECK(!o.out.empty(), "moetron train needs --out RUN_DIR (or --dry-run)");
  MOETRON_CHECK(o.resume || (!o.allow_fresh_start && o.allow_config_change.empty()),
                "--allow-fresh-start and --allow-config-change go with --resume");
  return train_ranks(o);
}

}  // namespace moetron::cli
