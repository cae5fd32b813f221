// The training loop of Trainer: run() and one step's parts.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "moetron/core/threading.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/optim/zero_optimizer.h"
#include "moetron/train/fault_injection.h"
#include "moetron/train/heartbeat.h"
#include "moetron/train/memory_report.h"
#include "moetron/train/peak_flops.h"
#include "moetron/train/trainer.h"

namespace moetron::train {

using clock_type = std::chrono::steady_clock;

TrainResult Trainer::run() {
  TrainResult res;
  res.val_loss = NAN;
  std::ofstream metrics;
  if (is_root()) {
    metrics.open(run_dir_ + "/metrics.jsonl", std::ios::app);
    MOETRON_CHECK(metrics.good(), "cannot open '", run_dir_, "/metrics.jsonl' for writing");
  }
  std::vector<Tensor> inputs, targets;
  for (int64_t m = 0; m < acc_; ++m) {
    inputs.push_back(Tensor::empty({cfg_.train.micro_batch, cfg_.train.seq_len}, DType::i32));
    targets.push_back(Tensor::empty({cfg_.train.micro_batch, cfg_.train.seq_len}, DType::i32));
  }
  if (peak_flops_ == 0)
    peak_flops_ = measure_peak_flops(prec_.compute, static_cast<int>(cfg_.train.threads));
  print_memory_plan();
  announce_start();
  cpu_allocator().reset_peaks();
  for (int64_t step = start_step_ + 1; step <= cfg_.train.steps; ++step) {
    const int64_t grad_bytes_before = gradient_bytes_sent();
    StepRecord rec = train_step(step, inputs, targets);
    if (step == start_step_ + 1) record_recovery();
    if (res.history.empty())
      res.first_step_memory = cpu_allocator().stats();  // before any evaluation
    nlohmann::json line = metrics_line(rec, grad_bytes_before);
    record_router_metrics();  // the step's loads, before the routers move on
    if (batcher_) adapt_modality_routing(rec, line);
    advance_routers(rec.skipped);
    watch_divergence(rec, line);
    advance_compression(rec, line);
    if ((cfg_.train.eval_every > 0 && step % cfg_.train.eval_every == 0) ||
        step == cfg_.train.steps) {
      res.val_loss = evaluate();
      line["val_loss"] = res.val_loss;
      if (monitor_->enabled() && is_root()) monitor_->metrics().record_validation(res.val_loss);
    }
    // A diverged model is not saved: the last checkpoint stays the newest.
    keep_state(step, rec);
    report_persist(false);
    record_metrics(rec);
    if (is_root()) {
      monitor_->finish_line(line);
      write_metrics(metrics, line);
      if (step % cfg_.train.log_every == 0 || step == cfg_.train.steps || step == start_step_ + 1)
        log_line(rec);
      if (line.contains("val_loss") && !::isatty(STDOUT_FILENO)) {
        std::cout << "step " << step << " | validation loss " << res.val_loss << std::endl;
      }
    }
    if (!guard_.stop_reason().empty()) {
      if (is_root() && ::isatty(STDOUT_FILENO)) std::cout << "\n";
      monitor_->event(step, "stop", guard_.stop_reason());
      report_persist(true);  // the last good checkpoint finishes reaching the disk
      MOETRON_FAIL(guard_.stop_reason(), "; no checkpoint of this model was saved");
    }
    if (res.history.empty() && is_root()) {
      // On a terminal the progress line has no newline yet (it redraws in place).
      if (::isatty(STDOUT_FILENO) && step != cfg_.train.steps) std::cout << "\n";
      std::cout << memory_table({{"measured peak, step " + std::to_string(step),
                                  measured_peaks(cpu_allocator().stats())}})
                << std::flush;
    }
    if (res.history.empty()) res.first_loss = rec.loss;
    res.last_loss = rec.loss;
    res.history.push_back(rec);
    ++res.steps_done;
    if (stop_requested_ && step != cfg_.train.steps) {
      stop_for_resize(step);
      res.stopped_for_resize = true;
      break;
    }
  }
  if (res.stopped_for_resize) return finish_result(std::move(res));
  report_persist(true);  // before the final save prunes beside it
  if (res.steps_done > 0) save_checkpoint(cfg_.train.steps);
  finish_snapshots();
  monitor_->event(cfg_.train.steps, "stop", "trained " + std::to_string(res.steps_done) + " steps",
                  {{"steps_done", res.steps_done}, {"skipped_steps", skipped_}});
  return finish_result(std::move(res));
}

TrainResult Trainer::finish_result(TrainResult res) {
  monitor_->finish();
  res.skipped_steps = skipped_;
  res.loss_spikes = guard_.spikes();
  res.metrics_write_failures = metrics_failures_;
  res.final_loss_scale = fp16_ ? scaler_.scale() : 1.0;
  return res;
}

void Trainer::save_periodic_checkpoint(int64_t step) {
  // While steps are being skipped the model may already be wrecked (its
  // losses exploded first): the last checkpoint before stays the newest.
  if (guard_.consecutive_skips() > 0) {
    if (is_root()) {
      std::cerr << "warning: not saving checkpoint step-" << step << ": the last "
                << guard_.consecutive_skips() << " steps were skipped" << std::endl;
    }
    return;
  }
  try {
    save_checkpoint(step);
  } catch (const Error& e) {
    // Every rank throws the same agreed failure (a full disk): nothing was
    // published, the previous checkpoint stays the newest, training goes on.
    if (is_root()) {
      std::cerr << "warning: checkpoint step-" << step << " was not saved: " << e.what()
                << "; the previous checkpoint is kept" << std::endl;
      if (monitor_->enabled()) {
        monitor_->metrics().record_persist_failure();
        monitor_->event(step, "checkpoint_failed", e.what(), {{"error", e.what()}});
      }
    }
  }
}

void Trainer::watch_divergence(const StepRecord& rec, nlohmann::json& line) {
  // An fp16 overflow is the loss scale's business while it can still halve.
  const bool counts = rec.skipped && !(rec.overflow && rec.loss_scale > 1);
  const double recent = guard_.recent_mean();
  const bool spike = guard_.record(rec.step, rec.loss, counts);
  const bool first = spike && !spiking_;  // one warning per run of spikes
  spiking_ = spike;
  if (spike) {
    line["loss_spike"] = true;
    if (is_root() && first) {
      if (::isatty(STDOUT_FILENO)) std::cout << "\n";
      std::cerr << "warning: step " << rec.step << ": loss " << rec.loss << " is more than "
                << cfg_.train.loss_spike_factor << " x its recent mean " << recent
                << " (train.loss_spike_factor); the run may be diverging" << std::endl;
    }
  }
}

void Trainer::write_metrics(std::ofstream& metrics, const nlohmann::json& line) {
  metrics << line.dump() << "\n" << std::flush;
  if (metrics.good()) return;
  // A full disk or a lost file: say so once, keep training, try again next step.
  if (metrics_failures_++ == 0) {
    std::cerr << "warning: writing '" << run_dir_ << "/metrics.jsonl' failed at step "
              << line.value("step", int64_t{0}) << " (" << std::strerror(errno)
              << "); its metrics are lost while this lasts" << std::endl;
  }
  metrics.clear();
}

void Trainer::print_memory_plan() const {
  if (!is_root()) return;
  // One prediction per pipeline stage (its first rank's: the ranks of a
  // stage differ only by the routing under ep), from the plan the job runs.
  for (int64_t s = 0; s < pp(); ++s) {
    const int rank = static_cast<int>(s * plan_->stage_size());
    std::cout << memory_plan(cfg_, *plan_, rank, num_compute_threads()) << std::flush;
  }
}

StepRecord Trainer::train_step(int64_t step, std::vector<Tensor>& inputs,
                               std::vector<Tensor>& targets) {
  write_heartbeat(world_->rank(), step);  // for `moetron launch` (train/heartbeat.h)
  maybe_inject_failure(world_->rank(), step, FailurePoint::step);
  const double blocked_before = blocked_seconds();
  const auto t0 = clock_type::now();
  std::vector<int64_t> mb_tokens(static_cast<size_t>(acc_), 0);
  if (batcher_) {
    fill_multimodal_batches(step, inputs, targets, mb_tokens);
  } else {
    fill_batches(step, inputs, targets, mb_tokens);
  }
  StepRecord rec;
  rec.step = step;
  rec.data_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  for (int64_t n : mb_tokens) rec.tokens += n;
  model_->params().zero_grads();
  monitor_->before_step(step, *model_);
  forward_backward_step(step, inputs, targets, mb_tokens, rec);
  if (before_update) before_update(step);
  const auto t_update = clock_type::now();
  apply_update(step, rec);
  if (batcher_) finish_tasks(rec);
  rec.optimizer_s = std::chrono::duration<double>(clock_type::now() - t_update).count();
  monitor_->after_update(step, *ctx_, *model_, 1.0 / rec.loss_scale,
                         [this](const nn::Parameter& p) {
                           return std::any_of(zero_parts_.begin(), zero_parts_.end(),
                                              [&](optim::ZeroOptimizer* z) { return z->holds(p); });
                         });
  rec.step_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  rec.blocked_s = blocked_seconds() - blocked_before;
  rec.tokens_per_s = static_cast<double>(rec.tokens) / rec.step_s;
  // The media's FLOPs (multimodal) spread over the step's target tokens.
  const double media_per_token =
      batcher_ && rec.tokens > 0 ? step_media_flops_ / static_cast<double>(rec.tokens) : 0.0;
  rec.mfu = model_flops_utilization(rec.tokens_per_s, flops_per_token() + media_per_token,
                                    peak_flops_, world_->size());
  write_heartbeat(world_->rank(), step, HeartbeatPhase::end);
  return rec;
}

void Trainer::forward_backward_step(int64_t step, std::vector<Tensor>& inputs,
                                    std::vector<Tensor>& targets,
                                    const std::vector<int64_t>& mb_tokens, StepRecord& rec) {
  // fp16: the loss (hence every gradient) is multiplied by the loss scale;
  // the optimizer divides it out.
  const double loss_scale = fp16_ ? scaler_.scale() : 1.0;
  rec.loss_scale = loss_scale;
  const auto step_tokens = static_cast<double>(rec.tokens);
  // ce (the last stage's, once per tp group), dropped (every rank's
  // slots), aux and z loss (once per stage: equal on its ranks), over ranks.
  Tensor sums = Tensor::zeros({4}, DType::f64, MemTag::comm);
  double* sm = sums.data<double>();
  if (batcher_) scale_tasks(loss_scale);
  const auto add_stats = [&](const nn::LossStats& st, double share) {
    if (batcher_) {
      // ce once per tp group; the gradient's squares from every tp rank
      // under sequence parallelism (each holds a slice of the rows).
      nn::LossStats t = st;
      if (!first_of_tp_row()) {
        t.task_ce_sum.clear();
        t.task_tokens.clear();
        if (!plan_->settings().sequence_parallel) t.task_grad_sq.clear();
      }
      task_stats_.add_tasks(t);
    }
    if (first_of_tp_row()) sm[0] += st.ce_sum;
    sm[1] += static_cast<double>(st.dropped);
    if (at().stage_rank == 0) {
      sm[2] += st.aux_loss * share;
      sm[3] += st.z_loss * share;
    }
  };
  const auto arm = [&] {
    refresh_preconditioners(step);
    for_each_reducer([&](parallel::GradReducer& r) { r.arm(step); });
  };
  if (pipeline_) {
    std::vector<double> weights;
    for (int64_t n : mb_tokens)
      weights.push_back(static_cast<double>(n) / step_tokens * loss_scale);
    const PipelineRunner::StepResult pr =
        pipeline_->train_step(*ctx_, inputs, targets, loss_scale / step_tokens, weights, arm);
    // The micro-batches' aux losses are already weighted by their shares (x loss scale).
    nn::LossStats st = pr.stats;
    st.aux_loss /= loss_scale;
    st.z_loss /= loss_scale;
    add_stats(st, 1.0);
    rec.pipeline_wait_s = pr.wait_s;
    rec.forward_s = pr.forward_s;
    rec.backward_s = pr.backward_s;
  } else {
    for (int64_t m = 0; m < acc_; ++m) {
      const auto mi = static_cast<size_t>(m);
      const double share = static_cast<double>(mb_tokens[mi]) / step_tokens;
      if (m == acc_ - 1) arm();
      if (batcher_) model_->set_multimodal(mm_batches_[mi]);
      const nn::LossStats st = model_->forward_backward(
          *ctx_, inputs[mi], targets[mi], loss_scale / step_tokens, share * loss_scale, true);
      add_stats(st, share);
      rec.forward_s += st.forward_s;
      rec.backward_s += st.backward_s;
    }
  }
  for_each_reducer([&](parallel::GradReducer& r) {
    r.finish(*ctx_);
    rec.comm_wait_s += r.last_wait_seconds();
  });
  if (world_->size() > 1) world_->allreduce(sums, comm::ReduceOp::sum);
  rec.loss = sm[0] / step_tokens;
  rec.dropped = static_cast<int64_t>(sm[1]);
  rec.aux_loss = sm[2];
  rec.z_loss = sm[3];
}

void Trainer::apply_update(int64_t step, StepRecord& rec) {
  rec.grad_norm = grad_norm(1.0 / rec.loss_scale);
  reduce_expert_loads();
  const bool overflow = fp16_ && std::isfinite(rec.loss) && !std::isfinite(rec.grad_norm);
  if (!overflow && (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm))) {
    MOETRON_CHECK(cfg_.train.nan_policy == "skip", "non-finite loss or gradient at step ", step,
                  " (train.nan_policy = \"stop\")");
  }
  if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
    // An fp16 overflow is expected now and then: skip, count, halve the scale.
    if (overflow) scaler_.update(false);
    rec.overflow = overflow;
    rec.lr = opt_->options().schedule.at(step);
    rec.skipped = true;
    ++skipped_;
    for (nn::MoeLayer* l : model_->moe_layers()) l->reset_load();
    return;
  }
  if (fp16_) scaler_.update(true);
  rec.lr = opt_->step(*ctx_, step, 1.0 / rec.loss_scale, rec.grad_norm).lr;
}

nlohmann::json Trainer::metrics_line(const StepRecord& rec, int64_t grad_bytes_before) {
  nlohmann::json line = {{"step", rec.step},
                         {"loss", rec.loss},
                         {"lr", rec.lr},
                         {"grad_norm", rec.grad_norm},
                         {"tokens_per_s", rec.tokens_per_s},
                         {"mfu", rec.mfu},
                         {"aux_loss", rec.aux_loss},
                         {"z_loss", rec.z_loss},
                         {"skipped", rec.skipped},
                         {"tokens", rec.tokens},
                         {"dropped_slots", rec.dropped},
                         {"step_s", rec.step_s}};
  if (pipeline_) {
    line["pipeline_wait_s"] = rec.pipeline_wait_s;
    // Each stage's time not waiting on the pipeline (its first rank's):
    // how balanced the stages really are.
    Tensor busy = Tensor::zeros({pp()}, DType::f64, MemTag::comm);
    busy.data<double>()[at().pp] = rec.step_s - rec.pipeline_wait_s;
    pp_comm_->allreduce(busy, comm::ReduceOp::sum);
    line["stage_busy_s"] = std::vector<double>(busy.data<double>(), busy.data<double>() + pp());
  }
  if (reducer_) {
    line["comm_wait_s"] = rec.comm_wait_s;
    line["grad_bytes_sent"] = gradient_bytes_sent() - grad_bytes_before;  // this rank, this step
    if (cfg_.parallel.compression != "none") {
      line["compressed"] = rec.step >= reducer_->compressing_from();
      if (rec.step >= reducer_->compressing_from())
        line["ef_residual_rms"] = reducer_->last_residual_rms();
    }
  }
  if (fp16_) line["loss_scale"] = rec.loss_scale;
  nlohmann::json loads = nlohmann::json::array();
  for (nn::MoeLayer* l : model_->moe_layers()) {
    loads.push_back(l->expert_load());
  }
  line["expert_load"] = loads;
  if (batcher_) {
    nlohmann::json loss = nlohmann::json::object(), weight = nlohmann::json::object();
    const std::vector<std::string> names = task_names(batcher_->mix());
    for (size_t i = 0; i < names.size() && i < rec.task_loss.size(); ++i) {
      if (std::isfinite(rec.task_loss[i])) loss[names[i]] = rec.task_loss[i];
      weight[names[i]] = rec.task_weight[i];
    }
    line["task_loss"] = loss;
    line["task_weight"] = weight;
  }
  return line;
}

void Trainer::advance_routers(bool skipped) {
  for (nn::MoeLayer* l : model_->moe_layers()) {
    if (skipped) continue;
    if (cfg_.moe.bias_update_rate > 0) {
      l->update_bias(cfg_.moe.bias_update_rate);
    } else {
      l->reset_load();
    }
  }
}

void Trainer::log_line(const StepRecord& r) {
  const double eta = eta_seconds(r, cfg_.train.steps);
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %5lld/%lld | loss %.4f | lr %.2e | grad %.3f | %7.0f tok/s | MFU %5.1f%% | "
                "ETA %4.0fs%s",
                static_cast<long long>(r.step), static_cast<long long>(cfg_.train.steps), r.loss,
                r.lr, r.grad_norm, r.tokens_per_s, 100.0 * r.mfu, eta,
                r.skipped ? " | skipped" : "");
  if (::isatty(STDOUT_FILENO)) {
    std::cout << "\r" << buf << "\033[K" << std::flush;
    if (r.step == cfg_.train.steps) std::cout << "\n";
  } else {
    std::cout << buf << std::endl;
  }
}

double Trainer::grad_norm(double grad_scale) {
  if (ep() == 1 && tp() == 1 && pp() == 1) return opt_->grad_norm(*ctx_, grad_scale);
  // After reduction a gradient is the same on every rank holding it: count
  // each expert once over its ep group, each tp block once over tp, the
  // replicated rest locally.
  double replicated = 0;
  Tensor expert = Tensor::zeros({1}, DType::f64, MemTag::comm);
  Tensor sharded = Tensor::zeros({1}, DType::f64, MemTag::comm);
  // ZeRO-1: its gradients live reduced in its bucket chunks, each counted
  // once over its group.
  for (optim::ZeroOptimizer* z : zero_parts_) {
    const optim::ZeroOptimizer::GradSquares sq =
        z->grad_squares(*ctx_);  // collective over its group
    replicated += sq.replicated;
    sharded.data<double>()[0] += sq.blocks;
  }
  for (const auto& p : model_->params().all()) {
    if (std::any_of(zero_parts_.begin(), zero_parts_.end(),
                    [&](optim::ZeroOptimizer* z) { return z->holds(*p); })) {
      continue;
    }
    const bool is_expert = ep() > 1 && p->kind == nn::ParallelKind::expert;
    const double sq = kernels::sum_squares(*ctx_, p->grad);
    if (is_expert) {
      expert.data<double>()[0] += sq;
    } else if (p->sharded()) {
      if (p->shard.primary) sharded.data<double>()[0] += sq;
    } else {
      replicated += sq;
    }
  }
  if (ep_comm_) ep_comm_->allreduce(expert, comm::ReduceOp::sum);
  if (tp_comm_) tp_comm_->allreduce(sharded, comm::ReduceOp::sum);
  Tensor total = Tensor::empty({1}, DType::f64, MemTag::comm);
  total.data<double>()[0] = replicated + expert.data<double>()[0] + sharded.data<double>()[0];
  if (pp_comm_) pp_comm_->allreduce(total, comm::ReduceOp::sum);  // the stages' layers
  return std::sqrt(total.data<double>()[0]) * std::fabs(grad_scale);
}

void Trainer::keep_only_answers(int32_t* row_targets) const {
  // A window is one whole example (example_tokens = seq_len + 1, checked
  // when the corpus opened), so its answers are its last targets.
  if (answer_tokens_ <= 0) return;
  std::fill(row_targets, row_targets + cfg_.train.seq_len - answer_tokens_, -1);
}

void Trainer::fill_batches(int64_t step, std::vector<Tensor>& inputs, std::vector<Tensor>& targets,
                           std::vector<int64_t>& mb_tokens) {
  // Rows of the global batch, in order: micro-batch m of the step is rows
  // [m * mb * dp, (m + 1) * mb * dp), rank r taking mb of them. dp = 1 with
  // micro_batch = mb * dp reads exactly the same micro-batches.
  const int64_t s = cfg_.train.seq_len, mb = cfg_.train.micro_batch, dp = plan_->dp();
  std::vector<int32_t> window(static_cast<size_t>(s + 1));
  // The last element carries rank 0's "stop for a resize" flag (the
  // launcher asked: train/trainer_recovery.cpp) at no extra collective.
  Tensor counts = Tensor::zeros({acc_ + 1}, DType::i64, MemTag::comm);
  if (is_root()) counts.data<int64_t>()[acc_] = launcher_asks_to_stop() ? 1 : 0;
  for (int64_t m = 0; m < acc_; ++m) {
    const auto mi = static_cast<size_t>(m);
    for (int64_t r = 0; r < mb; ++r) {
      const auto index =
          static_cast<uint64_t>((step - 1) * mb * acc_ * dp + m * mb * dp + at().dp * mb + r);
      sampler_->fill(index, window.data());
      if (on_sample) on_sample(step, index);
      std::copy(window.begin(), window.end() - 1, inputs[mi].data<int32_t>() + r * s);
      std::copy(window.begin() + 1, window.end(), targets[mi].data<int32_t>() + r * s);
      keep_only_answers(targets[mi].data<int32_t>() + r * s);
    }
    const int32_t* tp = targets[mi].data<int32_t>();
    // The tp and cp ranks (and the stages) hold the same rows.
    if (at().tp == 0 && at().cp == 0 && at().pp == 0) {
      for (int64_t i = 0; i < mb * s; ++i) counts.data<int64_t>()[m] += tp[i] >= 0;
    }
  }
  // Normalisation is by the global batch's tokens: each micro-batch's count
  // summed over the dp ranks.
  if (world_->size() > 1) world_->allreduce(counts, comm::ReduceOp::sum);
  for (int64_t m = 0; m < acc_; ++m) mb_tokens[static_cast<size_t>(m)] = counts.data<int64_t>()[m];
  stop_requested_ = counts.data<int64_t>()[acc_] > 0;
}

void Trainer::reduce_expert_loads() {
  const auto layers = model_->moe_layers();
  if (stage().size() == 1 || layers.empty()) return;
  const auto e = static_cast<int64_t>(layers.front()->expert_load().size());
  Tensor loads = Tensor::empty({static_cast<int64_t>(layers.size()) * e}, DType::i64, MemTag::comm);
  for (size_t l = 0; l < layers.size(); ++l) {
    std::copy(layers[l]->expert_load().begin(), layers[l]->expert_load().end(),
              loads.data<int64_t>() + static_cast<int64_t>(l) * e);
  }
  stage().allreduce(loads, comm::ReduceOp::sum);
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t* p = loads.data<int64_t>() + static_cast<int64_t>(l) * e;
    layers[l]->set_expert_load(std::vector<int64_t>(p, p + e));
  }
}

}  // namespace moetron::train
