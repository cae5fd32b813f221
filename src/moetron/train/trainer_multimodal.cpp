// The trainer's multimodal path (issue 21): batches from the multimodal
// corpus (train/multimodal_batches.h), each task's loss weighted by the
// multi-task balancer (train/multitask_balance.h) and normalised by that
// task's target tokens over the whole step:
//   objective = sum_task w_task * (mean cross-entropy of the task's targets)
// so a task's share of the gradient does not depend on how many of its
// samples the step happened to draw.
#include <cmath>
#include <iostream>
#include <limits>

#include "moetron/core/error.h"
#include "moetron/nn/media_flops.h"
#include "moetron/train/trainer.h"

namespace moetron::train {

namespace {

MultitaskSettings multitask_settings(const Config& cfg, const TaskMix& mix) {
  MultitaskSettings s;
  s.tasks = task_names(mix);
  s.proportions = mix.shares;
  s.weights.assign(s.tasks.size(), 1.0);
  if (!cfg.multitask.weights.empty()) {
    const TaskMix w = parse_task_mix(cfg.multitask.weights, "multitask.weights");
    for (size_t i = 0; i < w.tasks.size(); ++i) {
      for (size_t j = 0; j < mix.tasks.size(); ++j)
        if (mix.tasks[j] == w.tasks[i]) s.weights[j] = w.values[i];
    }
  }
  for (BalanceMethod m : {BalanceMethod::kFixed, BalanceMethod::kUncertainty,
                          BalanceMethod::kGradNorm, BalanceMethod::kDwa}) {
    if (cfg.multitask.balance == balance_method_name(m)) s.method = m;
  }
  s.gradnorm_alpha = cfg.multitask.gradnorm_alpha;
  s.gradnorm_lr = cfg.multitask.gradnorm_lr;
  s.dwa_temperature = cfg.multitask.dwa_temperature;
  s.uncertainty_lr = cfg.multitask.uncertainty_lr;
  return s;
}

}  // namespace

void Trainer::open_multimodal_corpus() {
  const MultimodalConfig& m = cfg_.multimodal;
  const TaskMix mix = parse_task_mix(m.mix, "multimodal.mix");
  batcher_ = std::make_unique<MultimodalBatcher>(m.data, m.model, mix, cfg_.train.seq_len,
                                                 m.audio_frames, cfg_.train.seed);
  const int64_t vocab = batcher_->dataset().manifest().vocab_size;
  MOETRON_CHECK(vocab <= cfg_.model.vocab_size, "multimodal corpus '", m.data,
                "' has a vocabulary of ", vocab, " but model.vocab_size is ",
                cfg_.model.vocab_size);
  balancer_ = std::make_unique<MultitaskBalancer>(multitask_settings(cfg_, mix));
}

void Trainer::fill_multimodal_batches(int64_t step, std::vector<Tensor>& inputs,
                                      std::vector<Tensor>& targets,
                                      std::vector<int64_t>& mb_tokens) {
  // Rows of the global batch in the text path's order (fill_batches).
  const int64_t s = cfg_.train.seq_len, mb = cfg_.train.micro_batch, dp = plan_->dp();
  const int64_t tasks = batcher_->num_tasks();
  // Per micro-batch, then the stop flag, then per task, then the media's
  // model FLOPs (for MFU; whole FLOPs fit an i64 with room to spare).
  Tensor counts = Tensor::zeros({acc_ + 2 + tasks}, DType::i64, MemTag::comm);
  int64_t* c = counts.data<int64_t>();
  if (is_root()) c[acc_] = launcher_asks_to_stop() ? 1 : 0;
  mm_batches_.assign(static_cast<size_t>(acc_), nullptr);
  for (int64_t m = 0; m < acc_; ++m) {
    const auto mi = static_cast<size_t>(m);
    std::vector<uint64_t> indices;
    for (int64_t r = 0; r < mb; ++r) {
      indices.push_back(
          static_cast<uint64_t>((step - 1) * mb * acc_ * dp + m * mb * dp + at().dp * mb + r));
      if (on_sample) on_sample(step, indices.back());
    }
    mm_batches_[mi] = batcher_->build(data::Split::train, indices, inputs[mi], targets[mi]);
    if (at().tp != 0 || at().cp != 0 || at().pp != 0) continue;  // they hold the same rows
    c[acc_ + 1 + tasks] += static_cast<int64_t>(
        nn::media_flops(cfg_.multimodal.model, cfg_.model, *mm_batches_[mi], s));
    const int32_t* tp = targets[mi].data<int32_t>();
    for (int64_t r = 0; r < mb; ++r) {
      int64_t n = 0;
      for (int64_t i = r * s; i < (r + 1) * s; ++i) n += tp[i] >= 0;
      c[m] += n;
      c[acc_ + 1 + mm_batches_[mi]->row_task[static_cast<size_t>(r)]] += n;
    }
  }
  if (world_->size() > 1) world_->allreduce(counts, comm::ReduceOp::sum);
  for (int64_t m = 0; m < acc_; ++m) mb_tokens[static_cast<size_t>(m)] = c[m];
  stop_requested_ = c[acc_] > 0;
  step_task_tokens_.assign(c + acc_ + 1, c + acc_ + 1 + tasks);
  step_media_flops_ = static_cast<double>(c[acc_ + 1 + tasks]);
  task_stats_ = nn::LossStats{};
}

void Trainer::scale_tasks(double loss_scale) {
  const std::vector<double>& w = balancer_->weights();
  std::vector<double> scale(w.size(), 0.0);
  for (size_t i = 0; i < w.size(); ++i) {
    const auto n = static_cast<double>(step_task_tokens_[i]);
    scale[i] = n > 0 ? loss_scale * w[i] / n : 0.0;
  }
  for (auto& b : mm_batches_) b->task_grad_scale = scale;
  if (pipeline_) pipeline_->multimodal.assign(mm_batches_.begin(), mm_batches_.end());
}

void Trainer::finish_tasks(StepRecord& rec) {
  const auto n = static_cast<size_t>(batcher_->num_tasks());
  // ce sums and the gradient's squares per task, over every rank.
  Tensor sums = Tensor::zeros({static_cast<int64_t>(2 * n)}, DType::f64, MemTag::comm);
  double* sm = sums.data<double>();
  for (size_t i = 0; i < task_stats_.task_ce_sum.size(); ++i) sm[i] = task_stats_.task_ce_sum[i];
  for (size_t i = 0; i < task_stats_.task_grad_sq.size(); ++i)
    sm[n + i] = task_stats_.task_grad_sq[i];
  if (world_->size() > 1) world_->allreduce(sums, comm::ReduceOp::sum);
  const std::vector<double>& w = balancer_->weights();
  rec.task_weight = w;
  rec.task_loss.assign(n, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> grad_norms(n, 0.0);
  bool every_task = true;
  for (size_t i = 0; i < n; ++i) {
    const auto tokens = static_cast<double>(step_task_tokens_[i]);
    every_task = every_task && tokens > 0;
    if (tokens > 0) rec.task_loss[i] = sm[i] / tokens;
    // d_h of task i carried loss_scale * w_i / tokens_i per token loss.
    grad_norms[i] = w[i] > 0 ? std::sqrt(sm[n + i]) / (rec.loss_scale * w[i]) : 0.0;
  }
  // A step that drew no sample of some task, or was skipped, teaches the
  // balancer nothing: the weights stay.
  if (rec.skipped || !every_task) return;
  balancer_->update(rec.task_loss, balancer_->needs_grad_norms()
                                       ? std::span<const double>(grad_norms)
                                       : std::span<const double>());
}

void Trainer::adapt_modality_routing(const StepRecord& rec, nlohmann::json& line) {
  const std::vector<nn::MoeLayer*> layers = model_->moe_layers();
  if (layers.empty()) return;
  const auto per_layer =
      static_cast<int64_t>(layers.front()->expert_load_by_modality_flat().size());
  const int64_t m = layers.front()->num_modalities(), e = per_layer / m;
  // Every rank of the stage routed its own tokens: the loads are their sum.
  Tensor loads =
      Tensor::empty({static_cast<int64_t>(layers.size()) * per_layer}, DType::i64, MemTag::comm);
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::vector<int64_t>& f = layers[l]->expert_load_by_modality_flat();
    std::copy(f.begin(), f.end(), loads.data<int64_t>() + static_cast<int64_t>(l) * per_layer);
  }
  if (stage().size() > 1) stage().allreduce(loads, comm::ReduceOp::sum);
  nlohmann::json by_layer = nlohmann::json::array();
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t* p = loads.data<int64_t>() + static_cast<int64_t>(l) * per_layer;
    layers[l]->set_expert_load_by_modality(std::vector<int64_t>(p, p + per_layer));
    std::vector<std::vector<int64_t>> rows;
    for (int64_t i = 0; i < m; ++i) rows.emplace_back(p + i * e, p + (i + 1) * e);
    if (monitor_->enabled() && is_root()) {
      monitor_->metrics().record_modality_load(layer_group_of(layers[l]->prefix() + "router").first,
                                               rows);
    }
    by_layer.push_back(rows);
  }
  line["expert_load_by_modality"] = by_layer;
  if (cfg_.moe.modality_routing != "partitioned") return;
  // The owners this step's tokens were routed under (a move below takes
  // effect from the next step): what a collapse count needs to tell an
  // expert a modality may not use from one it leaves idle.
  nlohmann::json owners = nlohmann::json::array();
  for (nn::MoeLayer* l : layers) owners.push_back(l->expert_owners());
  line["expert_owners"] = owners;
  if (rec.skipped) return;
  // A modality's loss: the mean of its tasks' this step (the last known
  // when none of them drew a sample; 1 before any did).
  modality_loss_.resize(static_cast<size_t>(m), 1.0);
  for (int64_t mod = 0; mod < m; ++mod) {
    double sum = 0;
    int n = 0;
    for (size_t t = 0; t < rec.task_loss.size(); ++t) {
      const auto task_modality = static_cast<int64_t>(data::modality_of(batcher_->mix().tasks[t]));
      if (task_modality != mod || !std::isfinite(rec.task_loss[t])) continue;
      sum += rec.task_loss[t];
      ++n;
    }
    if (n > 0) modality_loss_[static_cast<size_t>(mod)] = sum / n;
  }
  nlohmann::json moves = nlohmann::json::array();
  for (nn::MoeLayer* l : layers) {
    const nn::AllocationMove mv = l->update_allocation(modality_loss_);
    if (mv.moved)
      moves.push_back(
          {{"layer", l->prefix()}, {"expert", mv.expert}, {"from", mv.from}, {"to", mv.to}});
  }
  if (!moves.empty()) line["modality_moves"] = moves;
}

double Trainer::evaluate_multimodal() {
  const int64_t b = cfg_.train.micro_batch, s = cfg_.train.seq_len;
  Tensor sums = Tensor::zeros({2}, DType::f64, MemTag::comm);
  Tensor inputs = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({b, s}, DType::i32);
  for (int64_t batch = 0; batch < cfg_.train.eval_batches; ++batch) {
    std::vector<uint64_t> indices;
    for (int64_t r = 0; r < b; ++r)
      indices.push_back(static_cast<uint64_t>((batch * plan_->dp() + at().dp) * b + r));
    auto mm = batcher_->build(data::Split::val, indices, inputs, targets);
    nn::LossStats st;
    if (pipeline_) {
      pipeline_->multimodal = {mm};
      st = pipeline_->forward_only(*ctx_, inputs, targets);
    } else {
      model_->set_multimodal(mm);
      st = model_->forward_backward(*ctx_, inputs, targets, 0, 0, false);
    }
    if (at().tp > 0) continue;
    sums.data<double>()[0] += st.ce_sum;
    sums.data<double>()[1] += static_cast<double>(st.tokens);
  }
  model_->set_multimodal(nullptr);
  if (pipeline_) pipeline_->multimodal.clear();
  world_->allreduce(sums, comm::ReduceOp::sum);
  return sums.data<double>()[0] / std::max(sums.data<double>()[1], 1.0);
}

}  // namespace moetron::train
