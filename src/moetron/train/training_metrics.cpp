#include "moetron/train/training_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>

namespace moetron::train {

namespace {

using monitor::MetricDef;
using monitor::MetricKind;

constexpr int64_t kLayerExpertSeries = 1 << 16;  // layers x experts
constexpr int64_t kLayerGroupSeries = 1 << 14;   // layers x matrix groups
constexpr int64_t kRankSeries = 1 << 14;         // ranks

MetricDef def(const char* name, MetricKind kind, const char* unit, const char* help,
              std::vector<std::string> labels = {}, int64_t max_series = 64) {
  MetricDef d;
  d.name = name;
  d.kind = kind;
  d.unit = unit;
  d.help = help;
  d.labels = std::move(labels);
  d.max_series = max_series;
  return d;
}

constexpr auto G = MetricKind::gauge;
constexpr auto C = MetricKind::counter;

// What a step does: loss, throughput, routing, communication, memory, the
// process and the machine's energy.
std::vector<MetricDef> step_metrics() {
  return {
      def("moetron_step", G, "", "the last completed optimizer step"),
      def("moetron_steps_total", C, "steps", "optimizer steps run (skipped ones included)"),
      def("moetron_tokens_total", C, "tokens", "target tokens trained on"),
      def("moetron_loss", G, "nats", "mean token cross-entropy of the last step"),
      def("moetron_validation_loss", G, "nats", "mean token cross-entropy on validation data"),
      def("moetron_learning_rate", G, "", "learning rate of the last step"),
      def("moetron_grad_norm", G, "", "global gradient L2 norm before clipping"),
      def("moetron_aux_loss", G, "", "MoE load-balancing loss of the last step"),
      def("moetron_z_loss", G, "", "router z-loss of the last step"),
      def("moetron_loss_scale", G, "", "fp16 dynamic loss scale"),
      def("moetron_skipped_steps_total", C, "steps",
          "steps skipped for a non-finite loss or gradient"),
      def("moetron_tokens_per_second", G, "tokens/s", "training throughput of the last step"),
      def("moetron_mfu_ratio", G, "ratio", "model FLOPs utilisation of the last step"),
      def("moetron_step_seconds", G, "seconds", "wall time of the last step"),
      def("moetron_step_duration_seconds", MetricKind::histogram, "seconds",
          "distribution of step wall times"),
      def("moetron_phase_seconds", G, "seconds", "the last step's time by phase", {"phase"}),
      def("moetron_pipeline_bubble_ratio", G, "ratio",
          "share of the last step spent waiting on pipeline transfers"),
      def("moetron_dropped_tokens_total", C, "slots",
          "(token, expert) slots dropped by the capacity factor"),
      def("moetron_expert_load_ratio", G, "ratio", "share of a layer's routed slots per expert",
          {"layer", "expert"}, kLayerExpertSeries),
      def("moetron_router_entropy", G, "ratio",
          "entropy of a layer's expert load over log(experts): 1 is perfectly balanced", {"layer"},
          kLayerGroupSeries),
      def("moetron_expert_load_imbalance_ratio", G, "ratio",
          "a layer's busiest expert's load over the mean load", {"layer"}, kLayerGroupSeries),
      def("moetron_router_bias", G, "", "aux-loss-free expert selection bias", {"layer", "expert"},
          kLayerExpertSeries),
      def("moetron_task_loss", G, "nats",
          "multimodal: a task's mean target cross-entropy in the last step that drew it", {"task"}),
      def("moetron_task_weight", G, "", "multimodal: a task's loss weight (multitask.balance)",
          {"task"}),
      def("moetron_modality_expert_load_ratio", G, "ratio",
          "share of a modality's routed slots per expert in a layer (modality-aware routing)",
          {"layer", "modality", "expert"}, kLayerExpertSeries),
      def("moetron_comm_bytes_total", C, "bytes", "bytes this rank sent, by plan axis and op",
          {"axis", "op"}, 256),
      def("moetron_comm_seconds_total", C, "seconds",
          "seconds this rank's communication took, by plan axis and op", {"axis", "op"}, 256),
      def("moetron_comm_calls_total", C, "calls", "communication calls, by plan axis and op",
          {"axis", "op"}, 256),
      def("moetron_memory_bytes", G, "bytes", "tensor memory in use by allocator tag", {"tag"}),
      def("moetron_memory_peak_bytes", G, "bytes", "peak tensor memory by allocator tag", {"tag"}),
      def("moetron_memory_reserved_bytes", G, "bytes",
          "memory the allocator holds (in use and cached)"),
      def("moetron_process_resident_bytes", G, "bytes", "resident set size of rank 0"),
      def("moetron_process_cpu_seconds_total", C, "seconds", "CPU time of rank 0's process"),
      def("moetron_energy_joules_total", C, "joules",
          "energy drawn by rank 0's machine (RAPL package/DRAM, NVML GPU), machine-wide",
          {"domain"}),
      def("moetron_power_watts", G, "watts",
          "mean power of rank 0's machine over the last step, by domain", {"domain"}),
      def("moetron_energy_per_token_joules", G, "joules/token",
          "rank 0's machine's energy over the last step (packages, DRAM, GPUs) per token"),
  };
}

// What the run's state and its ranks do: per-layer norms, checkpoints,
// snapshots, restarts, per-rank times, the layout.
std::vector<MetricDef> state_metrics() {
  return {
      def("moetron_param_grad_norm", G, "", "gradient L2 norm by layer and matrix group",
          {"layer", "group"}, kLayerGroupSeries),
      def("moetron_param_norm", G, "", "parameter L2 norm by layer and matrix group",
          {"layer", "group"}, kLayerGroupSeries),
      def("moetron_param_update_norm", G, "",
          "L2 norm of the last update by layer and matrix group", {"layer", "group"},
          kLayerGroupSeries),
      def("moetron_param_update_ratio", G, "ratio",
          "update norm over parameter norm by layer and matrix group", {"layer", "group"},
          kLayerGroupSeries),
      def("moetron_activation_rms", G, "", "RMS of a block's output over the step's tokens",
          {"layer"}, kLayerGroupSeries),
      def("moetron_checkpoint_save_seconds", G, "seconds", "wall time of the last save"),
      def("moetron_checkpoint_load_seconds", G, "seconds", "wall time of the resume's load"),
      def("moetron_checkpoint_bytes", G, "bytes", "size of the last checkpoint saved or loaded"),
      def("moetron_checkpoints_total", C, "checkpoints", "checkpoints saved by this run"),
      def("moetron_checkpoint_failures_total", C, "checkpoints",
          "background checkpoints that could not be saved (a full disk)"),
      def("moetron_snapshot_seconds", G, "seconds", "wall time of the last in-memory snapshot"),
      def("moetron_snapshots_total", C, "snapshots", "in-memory snapshots taken by this run"),
      def("moetron_restarts_total", C, "restarts",
          "times `moetron launch` relaunched this job after a failure"),
      def("moetron_recovery_seconds", G, "seconds",
          "from the last failure's detection to the relaunched job's first completed step"),
      def("moetron_rank_step_seconds", G, "seconds", "a rank's last step wall time", {"rank"},
          kRankSeries),
      def("moetron_rank_busy_seconds", G, "seconds",
          "a rank's last step minus its time blocked in communication", {"rank"}, kRankSeries),
      def("moetron_rank_data_seconds", G, "seconds", "a rank's last step's data loading", {"rank"},
          kRankSeries),
      def("moetron_rank_comm_wait_seconds", G, "seconds",
          "a rank's last step blocked waiting in communication", {"rank"}, kRankSeries),
      def("moetron_straggler", G, "", "1 while the rank is named a straggler", {"rank"},
          kRankSeries),
      def("moetron_stragglers_total", C, "events", "times a rank was named a straggler"),
      def("moetron_parallel_degree", G, "", "the layout's degree per axis", {"axis"}),
      def("moetron_run_info", G, "", "1, labelled with the run's settings",
          {"precision", "optimizer"}),
  };
}

const std::vector<MetricDef>& catalogue() {
  static const std::vector<MetricDef> defs = [] {
    std::vector<MetricDef> d = step_metrics();
    for (MetricDef& m : state_metrics()) d.push_back(std::move(m));
    for (MetricDef& m : d) {
      if (m.name == "moetron_step_duration_seconds") {
        m.buckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
      }
    }
    return d;
  }();
  return defs;
}

}  // namespace

void define_training_metrics(monitor::Registry& r) {
  for (const MetricDef& d : catalogue()) r.define(d);
}

TrainingMetrics::TrainingMetrics(monitor::Registry& r)
    : r_((define_training_metrics(r), r)),
      step_(r.get("moetron_step")),
      steps_total_(r.get("moetron_steps_total")),
      tokens_total_(r.get("moetron_tokens_total")),
      loss_(r.get("moetron_loss")),
      validation_loss_(r.get("moetron_validation_loss")),
      lr_(r.get("moetron_learning_rate")),
      grad_norm_(r.get("moetron_grad_norm")),
      aux_loss_(r.get("moetron_aux_loss")),
      z_loss_(r.get("moetron_z_loss")),
      loss_scale_(r.get("moetron_loss_scale")),
      skipped_total_(r.get("moetron_skipped_steps_total")),
      tokens_per_s_(r.get("moetron_tokens_per_second")),
      mfu_(r.get("moetron_mfu_ratio")),
      step_s_(r.get("moetron_step_seconds")),
      step_hist_(r.get("moetron_step_duration_seconds")),
      phase_s_(r.get("moetron_phase_seconds")),
      bubble_(r.get("moetron_pipeline_bubble_ratio")),
      dropped_total_(r.get("moetron_dropped_tokens_total")),
      expert_load_(r.get("moetron_expert_load_ratio")),
      router_entropy_(r.get("moetron_router_entropy")),
      load_imbalance_(r.get("moetron_expert_load_imbalance_ratio")),
      router_bias_(r.get("moetron_router_bias")),
      task_loss_(r.get("moetron_task_loss")),
      task_weight_(r.get("moetron_task_weight")),
      modality_load_(r.get("moetron_modality_expert_load_ratio")),
      comm_bytes_(r.get("moetron_comm_bytes_total")),
      comm_seconds_(r.get("moetron_comm_seconds_total")),
      comm_calls_(r.get("moetron_comm_calls_total")),
      mem_bytes_(r.get("moetron_memory_bytes")),
      mem_peak_(r.get("moetron_memory_peak_bytes")),
      mem_reserved_(r.get("moetron_memory_reserved_bytes")),
      rss_(r.get("moetron_process_resident_bytes")),
      cpu_seconds_(r.get("moetron_process_cpu_seconds_total")),
      energy_total_(r.get("moetron_energy_joules_total")),
      power_(r.get("moetron_power_watts")),
      energy_per_token_(r.get("moetron_energy_per_token_joules")),
      param_grad_norm_(r.get("moetron_param_grad_norm")),
      param_norm_(r.get("moetron_param_norm")),
      update_norm_(r.get("moetron_param_update_norm")),
      update_ratio_(r.get("moetron_param_update_ratio")),
      act_rms_(r.get("moetron_activation_rms")),
      ckpt_save_s_(r.get("moetron_checkpoint_save_seconds")),
      ckpt_load_s_(r.get("moetron_checkpoint_load_seconds")),
      ckpt_bytes_(r.get("moetron_checkpoint_bytes")),
      ckpt_total_(r.get("moetron_checkpoints_total")),
      ckpt_failures_(r.get("moetron_checkpoint_failures_total")),
      snapshot_s_(r.get("moetron_snapshot_seconds")),
      snapshots_total_(r.get("moetron_snapshots_total")),
      restarts_total_(r.get("moetron_restarts_total")),
      recovery_s_(r.get("moetron_recovery_seconds")),
      rank_step_s_(r.get("moetron_rank_step_seconds")),
      rank_busy_s_(r.get("moetron_rank_busy_seconds")),
      rank_data_s_(r.get("moetron_rank_data_seconds")),
      rank_comm_s_(r.get("moetron_rank_comm_wait_seconds")),
      straggler_(r.get("moetron_straggler")),
      stragglers_total_(r.get("moetron_stragglers_total")),
      degree_(r.get("moetron_parallel_degree")),
      run_info_(r.get("moetron_run_info")) {}

void TrainingMetrics::record_step(const StepRecord& rec) {
  step_.set(static_cast<double>(rec.step));
  steps_total_.add(1);
  tokens_total_.add(static_cast<double>(rec.tokens));
  loss_.set(rec.loss);
  lr_.set(rec.lr);
  grad_norm_.set(rec.grad_norm);
  aux_loss_.set(rec.aux_loss);
  z_loss_.set(rec.z_loss);
  loss_scale_.set(rec.loss_scale);
  if (rec.skipped) skipped_total_.add(1);
  tokens_per_s_.set(rec.tokens_per_s);
  mfu_.set(rec.mfu);
  step_s_.set(rec.step_s);
  step_hist_.observe(rec.step_s);
  const double accounted = rec.data_s + rec.forward_s + rec.backward_s + rec.comm_wait_s +
                           rec.optimizer_s + rec.checkpoint_s + rec.snapshot_s;
  const std::pair<const char*, double> phases[] = {
      {"data", rec.data_s},
      {"forward", rec.forward_s},
      {"backward", rec.backward_s},
      {"comm_exposed", rec.comm_wait_s},
      {"optimizer", rec.optimizer_s},
      {"checkpoint", rec.checkpoint_s},
      {"snapshot", rec.snapshot_s},
      {"pipeline_wait", rec.pipeline_wait_s},
      {"other", std::max(0.0, rec.step_s + rec.checkpoint_s + rec.snapshot_s - accounted)}};
  for (const auto& [phase, s] : phases) phase_s_.set({phase}, s);
  bubble_.set(rec.step_s > 0 ? rec.pipeline_wait_s / rec.step_s : 0.0);
  dropped_total_.add(static_cast<double>(rec.dropped));
}

void TrainingMetrics::record_layout(const std::vector<std::pair<std::string, int64_t>>& degrees,
                                    const std::string& precision, const std::string& optimizer) {
  for (const auto& [axis, d] : degrees) degree_.set({axis}, static_cast<double>(d));
  run_info_.set({precision, optimizer}, 1);
}

void TrainingMetrics::record_tasks(const std::vector<std::string>& names,
                                   const std::vector<double>& loss,
                                   const std::vector<double>& weight) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (i < loss.size() && std::isfinite(loss[i])) task_loss_.set({names[i]}, loss[i]);
    if (i < weight.size()) task_weight_.set({names[i]}, weight[i]);
  }
}

void TrainingMetrics::record_modality_load(const std::string& layer,
                                           const std::vector<std::vector<int64_t>>& load) {
  static const char* const kModalities[] = {"text", "image", "audio"};
  for (size_t m = 0; m < load.size(); ++m) {
    double total = 0;
    for (int64_t n : load[m]) total += static_cast<double>(n);
    if (total == 0) continue;
    const std::string name = m < 3 ? kModalities[m] : std::to_string(m);
    for (size_t e = 0; e < load[m].size(); ++e)
      modality_load_.set({layer, name, std::to_string(e)}, static_cast<double>(load[m][e]) / total);
  }
}

void TrainingMetrics::record_moe_layer(const std::string& layer, const std::vector<int64_t>& load,
                                       const std::vector<double>& bias) {
  const std::string& l = layer;
  double total = 0, busiest = 0;
  for (int64_t n : load) {
    total += static_cast<double>(n);
    busiest = std::max(busiest, static_cast<double>(n));
  }
  double entropy = 0;
  for (size_t e = 0; e < load.size(); ++e) {
    const double share = total > 0 ? static_cast<double>(load[e]) / total : 0.0;
    expert_load_.set({l, std::to_string(e)}, share);
    if (share > 0) entropy -= share * std::log(share);
  }
  const auto n = static_cast<double>(load.size());
  if (total > 0 && load.size() > 1) {
    router_entropy_.set({l}, entropy / std::log(n));
    load_imbalance_.set({l}, busiest / (total / n));
  }
  for (size_t e = 0; e < bias.size(); ++e) router_bias_.set({l, std::to_string(e)}, bias[e]);
}

void TrainingMetrics::record_comm(const std::string& axis, const comm::Communicator& c) {
  for (const auto& [op, s] : c.stats()) {
    const monitor::LabelValues labels = {axis, op};
    // Counters: add what happened since the last record.
    comm_bytes_.add(labels, static_cast<double>(s.bytes_sent) - comm_bytes_.value(labels));
    comm_seconds_.add(labels, std::max(0.0, s.seconds - comm_seconds_.value(labels)));
    comm_calls_.add(labels, static_cast<double>(s.calls) - comm_calls_.value(labels));
  }
}

void TrainingMetrics::record_memory(const MemStats& stats, int64_t reserved) {
  for (int t = 0; t < kNumMemTags; ++t) {
    const std::string tag(mem_tag_name(static_cast<MemTag>(t)));
    mem_bytes_.set({tag}, static_cast<double>(stats.current[static_cast<size_t>(t)]));
    mem_peak_.set({tag}, static_cast<double>(stats.peak[static_cast<size_t>(t)]));
  }
  mem_bytes_.set({"total"}, static_cast<double>(stats.total_current));
  mem_peak_.set({"total"}, static_cast<double>(stats.total_peak));
  mem_reserved_.set(static_cast<double>(reserved));
}

void TrainingMetrics::record_process() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  if (statm >> pages >> resident) {
    rss_.set(static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)));
  }
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) {
    const auto secs = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    const double cpu = secs(ru.ru_utime) + secs(ru.ru_stime);
    cpu_seconds_.add(std::max(0.0, cpu - last_cpu_seconds_));
    last_cpu_seconds_ = std::max(cpu, last_cpu_seconds_);
  }
}

void TrainingMetrics::record_energy(const std::vector<monitor::EnergyDelta>& deltas, double seconds,
                                    int64_t tokens) {
  double total = 0;
  for (const monitor::EnergyDelta& d : deltas) {
    energy_total_.add({d.domain}, d.joules);
    if (seconds > 0) power_.set({d.domain}, d.joules / seconds);
    if (d.in_total) total += d.joules;
  }
  if (!deltas.empty() && tokens > 0) {
    energy_per_token_.set(total / static_cast<double>(tokens));
  }
}

void TrainingMetrics::record_layer_norms(const std::vector<GroupNorms>& norms) {
  for (const GroupNorms& g : norms) {
    const monitor::LabelValues labels = {g.layer, g.group};
    param_norm_.set(labels, g.param);
    if (g.has_grad) param_grad_norm_.set(labels, g.grad);
    if (g.has_update) {
      update_norm_.set(labels, g.update);
      update_ratio_.set(labels, g.param > 0 ? g.update / g.param : 0.0);
    }
  }
}

void TrainingMetrics::record_activation_rms(const std::vector<double>& rms) {
  for (size_t l = 0; l < rms.size(); ++l) {
    if (std::isfinite(rms[l])) act_rms_.set({std::to_string(l)}, rms[l]);
  }
}

void TrainingMetrics::record_checkpoint_save(double seconds, int64_t bytes) {
  ckpt_save_s_.set(seconds);
  ckpt_bytes_.set(static_cast<double>(bytes));
  ckpt_total_.add(1);
}

void TrainingMetrics::record_snapshot(double seconds) {
  snapshot_s_.set(seconds);
  snapshots_total_.add(1);
}

void TrainingMetrics::record_recovery(int64_t restarts, double seconds) {
  restarts_total_.add(static_cast<double>(restarts));
  if (seconds >= 0) recovery_s_.set(seconds);
}

void TrainingMetrics::record_persist_failure() {
  ckpt_failures_.add(1);
}

void TrainingMetrics::record_checkpoint_load(double seconds, int64_t bytes) {
  ckpt_load_s_.set(seconds);
  ckpt_bytes_.set(static_cast<double>(bytes));
}

void TrainingMetrics::record_ranks(const std::vector<RankTimes>& ranks,
                                   const std::vector<bool>& stragglers) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const monitor::LabelValues rank = {std::to_string(r)};
    rank_step_s_.set(rank, ranks[r].step_s);
    rank_busy_s_.set(rank, ranks[r].busy_s);
    rank_data_s_.set(rank, ranks[r].data_s);
    rank_comm_s_.set(rank, ranks[r].blocked_s);
    straggler_.set(rank, r < stragglers.size() && stragglers[r] ? 1.0 : 0.0);
  }
}

}  // namespace moetron::train
