#include "moetron/train/trainer_monitor.h"

#include <fstream>
#include <iostream>

#include "moetron/core/error.h"
#include "moetron/monitor/http_server.h"
#include "moetron/monitor/json_series.h"

namespace moetron::train {

namespace {
// step, busy, data, blocked in communication (seconds): one row of the rank table.
constexpr int64_t kRankValues = 4;
}  // namespace

TrainerMonitor::TrainerMonitor(const Config& cfg, const std::string& run_dir,
                               comm::Communicator& world, const parallel::RankCoords& at)
    : cfg_(cfg.monitor),
      run_dir_(run_dir),
      root_(world.rank() == 0),
      stragglers_(cfg.monitor.straggler_margin, cfg.monitor.straggler_intervals),
      world_(&world) {
  if (!cfg_.enabled) return;
  metrics_ = std::make_unique<TrainingMetrics>(registry_);
  if (root_) events_ = std::make_unique<monitor::EventLog>(run_dir + "/events.jsonl");
  // Its own communicator: the gather's bytes are not training's.
  if (world.size() > 1) {
    gather_ = std::make_unique<monitor::RankGather>(world.split(0, world.rank()), kRankValues);
  }
  layer_stats_ = std::make_unique<LayerStatistics>(cfg.model, cfg.moe, at);
  if (root_ && cfg_.energy) {
    energy_ = std::make_unique<monitor::EnergyMeter>();
    std::cerr << "energy: " << energy_->describe() << "\n";
    if (!energy_->available()) energy_.reset();
  }
  if (root_ && cfg_.serve) start_server();
}

void TrainerMonitor::record_energy(const StepRecord& rec) {
  if (!energy_ || !metrics_) return;
  metrics_->record_energy(energy_->read(), rec.step_s, rec.tokens);
}

// Rank 0's HTTP server: /metrics for Prometheus, the dashboard at /. Its URL
// is printed and written to RUN_DIR/monitor.url (monitor.port = 0 picks a
// free port). A port that cannot be bound stops the run unless
// monitor.required = false.
void TrainerMonitor::start_server() {
  monitor::ServerOptions opts;
  opts.host = cfg_.host;
  opts.port = static_cast<int>(cfg_.port);
  try {
    server_ = std::make_unique<monitor::MonitorServer>(registry_, opts);
  } catch (const Error& e) {
    if (cfg_.required) throw;
    std::cerr << "warning: " << e.what() << "; training goes on without the server"
              << " (monitor.required = false)\n";
    return;
  }
  monitor::MonitorServer* server = server_.get();
  if (events_)
    events_->on_event = [server](const nlohmann::json& ev) { server->publish_event(ev); };
  std::ofstream(run_dir_ + "/monitor.url") << server_url() << "\n";
  std::cout << "monitor: dashboard " << server_url() << "  Prometheus " << server_url() << "metrics"
            << std::endl;
}

std::string TrainerMonitor::server_url() const {
  if (!server_) return "";
  return "http://" + server_->host() + ":" + std::to_string(server_->port()) + "/";
}

TrainerMonitor::~TrainerMonitor() = default;

bool TrainerMonitor::layer_step(int64_t step) const {
  return cfg_.enabled && cfg_.layer_stats_every > 0 && step % cfg_.layer_stats_every == 0;
}

void TrainerMonitor::before_step(int64_t step, nn::Transformer& model) {
  tracking_ = layer_step(step);
  if (!tracking_) return;
  for (const auto& b : model.blocks()) b->track_activations(true);
  if (cfg_.update_stats) layer_stats_->keep_parameters(model.params());
}

void TrainerMonitor::after_update(int64_t step, kernels::Context& ctx, nn::Transformer& model,
                                  double grad_scale,
                                  const std::function<bool(const nn::Parameter&)>& zero_held) {
  if (!tracking_ || !layer_step(step)) return;
  tracking_ = false;
  for (const auto& b : model.blocks()) b->track_activations(false);
  const std::vector<GroupNorms> norms =
      layer_stats_->measure(ctx, model.params(), grad_scale, *world_, zero_held);
  const std::vector<double> rms =
      layer_stats_->activation_rms(model, model.tensor_parallel().sequence_parallel, *world_);
  if (!root_) return;
  metrics_->record_layer_norms(norms);
  metrics_->record_activation_rms(rms);
}

void TrainerMonitor::exchange_rank_times(const StepRecord& rec) {
  if (!cfg_.enabled) return;
  const double busy = rec.step_s - rec.blocked_s;
  const std::vector<double> mine = {rec.step_s, busy, rec.data_s, rec.blocked_s};
  if (!gather_) {
    if (root_) record_rank_table(rec.step, {mine});
    return;
  }
  const std::optional<monitor::RankGather::Table> previous = gather_->exchange(mine);
  if (previous && root_) record_rank_table(rec.step - 1, *previous);
}

void TrainerMonitor::record_rank_table(int64_t step, const monitor::RankGather::Table& table) {
  std::vector<RankTimes> ranks;
  std::vector<double> busy;
  for (const std::vector<double>& row : table) {
    ranks.push_back({row[0], row[1], row[2], row[3]});
    busy.push_back(row[1]);
  }
  for (const monitor::StragglerDetector::Change& c : stragglers_.observe(busy)) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%.2f", c.ratio);
    if (c.straggling) {
      metrics_->count_straggler();
      const std::string msg = "rank " + std::to_string(c.rank) + " is a straggler: busy " + ratio +
                              "x the median rank's for " +
                              std::to_string(cfg_.straggler_intervals) + " steps";
      std::cerr << "warning: step " << step << ": " << msg << "\n";
      event(step, "straggler", msg, {{"rank", c.rank}, {"ratio", c.ratio}});
    } else {
      event(step, "straggler_cleared",
            "rank " + std::to_string(c.rank) + " is back within the margin (" + ratio + "x)",
            {{"rank", c.rank}, {"ratio", c.ratio}});
    }
  }
  std::vector<bool> flags;
  for (size_t r = 0; r < table.size(); ++r) {
    flags.push_back(stragglers_.is_straggler(static_cast<int>(r)));
  }
  metrics_->record_ranks(ranks, flags);
}

void TrainerMonitor::finish_line(nlohmann::json& line) {
  if (!cfg_.enabled || !root_) return;
  line["time"] = monitor::unix_time();
  line["series"] = monitor::json_series(registry_.snapshot());
  if (server_) server_->publish_step(line);
}

void TrainerMonitor::event(int64_t step, const std::string& kind, const std::string& message,
                           nlohmann::json extra) {
  if (events_) events_->write(step, kind, message, std::move(extra));
}

void TrainerMonitor::finish() {
  if (!gather_) return;
  const std::optional<monitor::RankGather::Table> last = gather_->finish();
  if (last && root_ && metrics_) {
    record_rank_table(static_cast<int64_t>(registry_.get("moetron_step").value()), *last);
  }
}

}  // namespace moetron::train
