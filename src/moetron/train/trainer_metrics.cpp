// Trainer's side of monitoring: what it hands TrainerMonitor each step.
#include <cmath>
#include <sstream>

#include "moetron/core/allocator.h"
#include "moetron/train/trainer.h"

namespace moetron::train {

void Trainer::announce_start() {
  if (!monitor_->enabled() || !is_root()) return;
  const parallel::PlanSettings& s = plan_->settings();
  const std::vector<std::pair<std::string, int64_t>> degrees = {{"world", world_->size()},
                                                                {"dp", plan_->dp()},
                                                                {"tp", s.tp},
                                                                {"pp", s.pp},
                                                                {"vpp", s.vpp},
                                                                {"ep", s.ep},
                                                                {"micro_batches", acc_}};
  monitor_->metrics().record_layout(degrees, std::string(dtype_name(prec_.compute)),
                                    cfg_.optim.name);
  nlohmann::json layout = nlohmann::json::object();
  std::ostringstream text;
  for (const auto& [axis, d] : degrees) {
    layout[axis] = d;
    text << (text.tellp() > 0 ? " " : "") << axis << "=" << d;
  }
  monitor_->event(start_step_, "start",
                  "training from step " + std::to_string(start_step_) + " to " +
                      std::to_string(cfg_.train.steps) + " (" + text.str() + ")",
                  {{"layout", layout},
                   {"steps", cfg_.train.steps},
                   {"precision", dtype_name(prec_.compute)},
                   {"config", to_toml(cfg_)}});
}

double Trainer::blocked_seconds() const {
  double total = 0;
  for (const auto& [axis, c] : named_comms()) total += c->total_stats().blocked_seconds;
  return total;
}

void Trainer::record_router_metrics() {
  if (!monitor_->enabled() || !is_root()) return;
  for (nn::MoeLayer* l : model_->moe_layers()) {
    std::vector<double> bias;
    const Tensor& b = l->bias();
    if (cfg_.moe.bias_update_rate > 0 && b.defined()) {
      for (int64_t e = 0; e < b.numel(); ++e) {
        bias.push_back(b.dtype() == DType::f64 ? b.data<double>()[e]
                                               : static_cast<double>(b.data<float>()[e]));
      }
    }
    // Under pipeline parallelism rank 0 sees its own stage's MoE layers only.
    monitor_->metrics().record_moe_layer(layer_group_of(l->prefix() + "router").first,
                                         l->expert_load(), bias);
  }
}

void Trainer::record_metrics(const StepRecord& rec) {
  if (!monitor_->enabled()) return;
  monitor_->exchange_rank_times(rec);  // collective
  if (!is_root()) return;
  TrainingMetrics& m = monitor_->metrics();
  m.record_step(rec);
  if (batcher_) m.record_tasks(task_names(batcher_->mix()), rec.task_loss, rec.task_weight);
  for (const auto& [axis, c] : named_comms()) m.record_comm(axis, *c);
  m.record_memory(cpu_allocator().stats(), cpu_allocator().reserved());
  m.record_process();
  monitor_->record_energy(rec);
  if (rec.skipped) {
    monitor_->event(rec.step, "skipped_step", "non-finite loss or gradient: step skipped",
                    {{"loss", std::isfinite(rec.loss) ? nlohmann::json(rec.loss) : nullptr}});
  }
}

}  // namespace moetron::train
