// What a training run measures, defined once (name, kind, unit, help,
// labels): the catalogue `moetron metrics --list` prints, and the recorder
// that turns a step's numbers into those metrics. The registry itself
// (monitor/) knows nothing of what they mean.
#pragma once

#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/core/allocator.h"
#include "moetron/monitor/energy_meter.h"
#include "moetron/monitor/metric_registry.h"
#include "moetron/nn/moe.h"
#include "moetron/train/layer_stats.h"
#include "moetron/train/step_record.h"

namespace moetron::train {

// Defines every training metric in `r` (throws if one already is).
void define_training_metrics(monitor::Registry& r);

// One rank's times for the straggler view (a row of RankGather's table).
struct RankTimes {
  double step_s = 0, busy_s = 0, data_s = 0, blocked_s = 0;
};

class TrainingMetrics {
 public:
  // Defines the catalogue in `r` and keeps handles to it.
  explicit TrainingMetrics(monitor::Registry& r);
  void record_step(const StepRecord& rec);
  void record_validation(double loss) { validation_loss_.set(loss); }
  void record_layout(const std::vector<std::pair<std::string, int64_t>>& degrees,
                     const std::string& precision, const std::string& optimizer);
  // An MoE layer's loads (token counts of the step), selection biases.
  void record_moe_layer(const std::string& layer, const std::vector<int64_t>& load,
                        const std::vector<double>& bias);
  // Multimodal: each task's mean loss in the step (NaN: not drawn) and weight.
  void record_tasks(const std::vector<std::string>& names, const std::vector<double>& loss,
                    const std::vector<double>& weight);
  // A layer's routed slots per modality and expert ([modality][expert]).
  void record_modality_load(const std::string& layer,
                            const std::vector<std::vector<int64_t>>& load);
  // A communicator's counters since the run started, under its plan axis.
  void record_comm(const std::string& axis, const comm::Communicator& c);
  void record_memory(const MemStats& stats, int64_t reserved);
  void record_process();
  // The machine's energy since the previous step's read, over the step's
  // seconds and tokens (monitor/energy_meter.h).
  void record_energy(const std::vector<monitor::EnergyDelta>& deltas, double seconds,
                     int64_t tokens);
  void record_layer_norms(const std::vector<GroupNorms>& norms);
  void record_activation_rms(const std::vector<double>& rms);
  void record_checkpoint_save(double seconds, int64_t bytes);
  void record_snapshot(double seconds);
  void record_persist_failure();
  // A relaunched job: restarts so far, seconds from the failure's detection
  // to this attempt's first completed step (< 0: unknown).
  void record_recovery(int64_t restarts, double seconds);
  void record_checkpoint_load(double seconds, int64_t bytes);
  void record_ranks(const std::vector<RankTimes>& ranks, const std::vector<bool>& stragglers);
  void count_straggler() { stragglers_total_.add(1); }

 private:
  monitor::Registry& r_;
  monitor::Metric &step_, &steps_total_, &tokens_total_, &loss_, &validation_loss_, &lr_;
  monitor::Metric &grad_norm_, &aux_loss_, &z_loss_, &loss_scale_, &skipped_total_;
  monitor::Metric &tokens_per_s_, &mfu_, &step_s_, &step_hist_, &phase_s_, &bubble_;
  monitor::Metric &dropped_total_, &expert_load_, &router_entropy_, &load_imbalance_, &router_bias_;
  monitor::Metric &task_loss_, &task_weight_, &modality_load_;
  monitor::Metric &comm_bytes_, &comm_seconds_, &comm_calls_;
  monitor::Metric &mem_bytes_, &mem_peak_, &mem_reserved_, &rss_, &cpu_seconds_;
  monitor::Metric &energy_total_, &power_, &energy_per_token_;
  monitor::Metric &param_grad_norm_, &param_norm_, &update_norm_, &update_ratio_, &act_rms_;
  monitor::Metric &ckpt_save_s_, &ckpt_load_s_, &ckpt_bytes_, &ckpt_total_, &ckpt_failures_;
  monitor::Metric &snapshot_s_, &snapshots_total_;
  monitor::Metric &restarts_total_, &recovery_s_;
  monitor::Metric &rank_step_s_, &rank_busy_s_, &rank_data_s_, &rank_comm_s_, &straggler_,
      &stragglers_total_;
  monitor::Metric &degree_, &run_info_;
  double last_cpu_seconds_ = 0;
};

}  // namespace moetron::train
