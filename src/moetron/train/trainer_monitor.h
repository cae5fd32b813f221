// The trainer's monitoring: the metrics registry and what feeds it each
// step (train/training_metrics.h), per-layer statistics every
// monitor.layer_stats_every steps, per-rank times gathered to rank 0 with
// stragglers named, events.jsonl, and rank 0's HTTP server. Every rank
// constructs one (it splits the world for its own gather communicator) and
// takes part in its collectives; rank 0 records.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moetron/monitor/energy_meter.h"
#include "moetron/monitor/event_log.h"
#include "moetron/monitor/metric_registry.h"
#include "moetron/monitor/rank_gather.h"
#include "moetron/monitor/straggler.h"
#include "moetron/train/config.h"
#include "moetron/train/layer_stats.h"
#include "moetron/train/training_metrics.h"

namespace moetron::monitor {
class MonitorServer;
}

namespace moetron::train {

class TrainerMonitor {
 public:
  // Collective over `world`.
  TrainerMonitor(const Config& cfg, const std::string& run_dir, comm::Communicator& world,
                 const parallel::RankCoords& at);
  ~TrainerMonitor();
  bool enabled() const { return cfg_.enabled; }
  bool is_root() const { return root_; }
  monitor::Registry& registry() { return registry_; }
  TrainingMetrics& metrics() { return *metrics_; }
  // Whether `step` measures per-layer statistics.
  bool layer_step(int64_t step) const;
  // Before the step's forward: activation sums on, parameters kept (update norms).
  void before_step(int64_t step, nn::Transformer& model);
  // After the update (collective on layer steps).
  void after_update(int64_t step, kernels::Context& ctx, nn::Transformer& model, double grad_scale,
                    const std::function<bool(const nn::Parameter&)>& zero_held);
  // Every step (collective): this rank's times out, the previous step's
  // table of every rank's in; names stragglers.
  void exchange_rank_times(const StepRecord& rec);
  // Rank 0 (monitor.energy): the machine's energy counters since the last step.
  void record_energy(const StepRecord& rec);
  // Rank 0: the step's line gets "time" and "series"; the server gets it.
  void finish_line(nlohmann::json& line);
  void event(int64_t step, const std::string& kind, const std::string& message,
             nlohmann::json extra = nlohmann::json::object());
  // The HTTP server's URL ("http://host:port/"), "" when this rank serves
  // nothing (monitor.serve = false, not rank 0, or it could not bind).
  std::string server_url() const;
  // Completes the gather in flight (collective at the end of run()).
  void finish();

 private:
  void record_rank_table(int64_t step, const monitor::RankGather::Table& table);
  void start_server();

  MonitorConfig cfg_;
  std::string run_dir_;
  bool root_;
  monitor::Registry registry_;
  std::unique_ptr<TrainingMetrics> metrics_;
  std::unique_ptr<monitor::EventLog> events_;
  std::unique_ptr<monitor::RankGather> gather_;
  monitor::StragglerDetector stragglers_;
  std::unique_ptr<LayerStatistics> layer_stats_;
  std::unique_ptr<monitor::EnergyMeter> energy_;  // rank 0, when a counter is readable
  comm::Communicator* world_;
  bool tracking_ = false;
  // Last: it reads registry_ until it is destroyed.
  std::unique_ptr<monitor::MonitorServer> server_;
};

}  // namespace moetron::train
