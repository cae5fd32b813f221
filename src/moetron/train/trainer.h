// The training loop: construct the plan (train/plan_config.h), build what it
// says (communicators, model, reducers, optimizers), then run steps:
// deterministic sampling, gradient accumulation normalised by the step's
// total token count, periodic validation, metrics (JSON lines), progress
// lines, checkpoints and resume.
#pragma once

#include <array>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/comm/communicator.h"
#include "moetron/comm/process_mesh.h"
#include "moetron/data/token_dataset.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/loss_scaler.h"
#include "moetron/optim/optimizer.h"
#include "moetron/parallel/grad_reducer.h"
#include "moetron/parallel/training_plan.h"
#include "moetron/train/compression_start.h"
#include "moetron/train/config.h"
#include "moetron/train/divergence_guard.h"
#include "moetron/train/multimodal_batches.h"
#include "moetron/train/multitask_balance.h"
#include "moetron/train/pipeline_runner.h"
#include "moetron/train/plan_config.h"
#include "moetron/train/stage_costs.h"
#include "moetron/train/step_record.h"
#include "moetron/train/trainer_monitor.h"

namespace moetron::optim {
class ZeroOptimizer;
}
namespace moetron::ckpt {
class SnapshotStore;
class AsyncPersister;
}  // namespace moetron::ckpt

namespace moetron::train {

struct TrainResult {
  int64_t steps_done = 0;
  // `moetron launch` asked the job to stop for a resize (elastic): the state
  // after the last step is in a snapshot (or a checkpoint), not trained out.
  bool stopped_for_resize = false;
  int64_t skipped_steps = 0;
  int64_t loss_spikes = 0;             // finite losses flagged by train.loss_spike_factor
  int64_t metrics_write_failures = 0;  // metrics.jsonl lines that could not be written
  double final_loss_scale = 1;         // fp16 only
  double first_loss = 0, last_loss = 0;
  double val_loss = 0;  // last validation loss (NaN if never evaluated)
  std::vector<StepRecord> history;
  // This rank's allocator after the first step's update: peaks per tag over
  // the step, with everything built before it (what planner::estimate_memory predicts).
  MemStats first_step_memory;
};

// How a Trainer treats what its run directory already holds.
struct ResumeOptions {
  // Continue from the newest complete checkpoint (a directory without one
  // starts a new run). Without it, a directory that holds a run is refused.
  bool resume = false;
  // With resume: when every checkpoint is damaged, set them aside (renamed
  // step-N.corrupt) and start from step 0 instead of stopping with an error.
  bool fresh_if_all_corrupt = false;
  // Model and routing keys a resume may change (train/resume_check.h).
  std::vector<std::string> allow_config_change;
};

class Trainer {
 public:
  // world: every rank of the job (nullptr: one local rank). Ranks of a
  // data-parallel run each read their slice of the global batch.
  Trainer(Config cfg, std::string run_dir, const ResumeOptions& resume,
          std::shared_ptr<comm::Communicator> world = nullptr);
  Trainer(Config cfg, std::string run_dir, bool resume,
          std::shared_ptr<comm::Communicator> world = nullptr)
      : Trainer(std::move(cfg), std::move(run_dir), ResumeOptions{resume, false, {}},
                std::move(world)) {}
  ~Trainer();
  TrainResult run();

  // Mean validation cross-entropy over cfg.train.eval_batches deterministic windows.
  double evaluate();
  nn::Transformer& model() { return *model_; }
  const Config& config() const { return cfg_; }
  optim::ParamOptimizer& optimizer() { return *opt_; }
  comm::Communicator& world() { return *world_; }
  // The data-parallel gradient reducer (nullptr on one rank without ZeRO-1);
  // its communicator carries exactly the gradient and ZeRO-1 parameter traffic.
  parallel::GradReducer* reducer() { return reducer_.get(); }
  // The expert-parallel group (nullptr when parallel.ep = 1): it carries
  // exactly the MoE token exchange (and the per-expert count all-gather).
  comm::Communicator* expert_comm() { return ep_comm_; }
  comm::Communicator* tensor_comm() { return tp_comm_; }
  comm::Communicator* pipeline_comm() { return pp_comm_; }
  // The gradient reducers' communicators (dense over dp, partial over the
  // stage, experts over their replicas); null where absent.
  std::vector<comm::Communicator*> gradient_comms() {
    return {grad_comm_.get(), partial_grad_comm_.get(), expert_grad_comm_.get()};
  }
  // Micro-batches per step on this rank (train.grad_accum or derived from train.global_batch).
  int64_t accumulation() const { return acc_; }
  // Writes RUN_DIR/checkpoints/step-N now (atomically; keeps checkpoint.keep).
  void save_checkpoint(int64_t step);
  kernels::Context& context() { return *ctx_; }
  // Test hook: runs before each optimizer step with the gradients in place.
  std::function<void(int64_t step)> before_update;
  // Test hook: every training sample this rank draws (its global index).
  std::function<void(int64_t step, uint64_t sample)> on_sample;

  // The plan this job runs and this rank's part of it.
  const parallel::TrainingPlan& plan() const { return *plan_; }
  const parallel::RankPlan& rank_plan() const { return rank_; }
  // The trainer's communicator for a group of the plan (nullptr where the
  // layout has none): what tests compare with plan().group().
  comm::Communicator* group_comm(parallel::Group g);
  // Metrics, events and the server (nullptr before construction ends).
  TrainerMonitor& monitor() { return *monitor_; }
  // This rank's communicators by the axis label its metrics carry.
  std::vector<std::pair<std::string, const comm::Communicator*>> named_comms() const;
  // The reducer carrying one kind of gradient (nullptr where the layout has none).
  parallel::GradReducer* reducer_for(parallel::GradGroup g) {
    return g == parallel::GradGroup::expert    ? expert_reducer_.get()
           : g == parallel::GradGroup::partial ? partial_reducer_.get()
                                               : reducer_.get();
  }

 private:
  // Construction, in order (trainer.cpp).
  void open_corpus();
  // data.source set: rank 0 prepares data.path if it is missing (collective).
  void prepare_corpus_on_first_use();
  void make_plan_for_world();
  void build_communicators();
  void build_model();
  // train.init_from: the weights (into the optimizer's masters) and router
  // biases of a checkpoint; the optimizer's state stays fresh.
  void load_initial_weights();
  void build_reducers();
  void build_optimizer();
  void refuse_existing_run() const;
  void resume_from_latest(const ResumeOptions& ro);
  // Rank 0: the checkpoint directory to resume from ("": start at 0), or
  // throws saying why not.
  std::string pick_checkpoint(const ResumeOptions& ro);
  // Snapshots and asynchronous checkpoints (trainer_recovery.cpp).
  void setup_snapshots(bool resume);
  ckpt::SaveRequest checkpoint_request(int64_t step);
  void take_snapshot(int64_t step);
  // While the interval is automatic and undecided: records a snapshot's
  // cost (collective) and decides after kSnapshotProbes snapshots.
  void probe_snapshot_cost(double snapshot_s, double step_s);
  // After a step: the snapshot and checkpoint.every's save it is due for.
  void keep_state(int64_t step, StepRecord& rec);
  // Reports a finished background persist (wait: the one in flight first).
  void report_persist(bool wait);
  void finish_snapshots();
  // Rank 0: whether the launcher left RUN/logs/stop-request (a resize).
  bool launcher_asks_to_stop() const;
  // Collective, before the first snapshot: whether every machine has room
  // for its ranks' snapshots (else they are turned off, with a warning).
  bool snapshots_fit(int64_t part_bytes);
  // After this attempt's first step: the restart count and recovery time
  // `moetron launch` passed in the environment, as metrics (rank 0).
  void record_recovery() const;
  // Keeps the state of `step` and tells the launcher the job stopped there.
  void stop_for_resize(int64_t step);
  TrainResult finish_result(TrainResult res);
  std::optional<std::string> newer_snapshot(int64_t disk_step);
  // One step (trainer_step.cpp).
  StepRecord train_step(int64_t step, std::vector<Tensor>& inputs, std::vector<Tensor>& targets);
  void forward_backward_step(int64_t step, std::vector<Tensor>& inputs,
                             std::vector<Tensor>& targets, const std::vector<int64_t>& mb_tokens,
                             StepRecord& rec);
  void apply_update(int64_t step, StepRecord& rec);
  nlohmann::json metrics_line(const StepRecord& rec, int64_t grad_bytes_before);
  // After a step's loads are recorded: the aux-free bias update (or reset).
  void advance_routers(bool skipped);
  void print_memory_plan() const;
  // The step's metrics into the registry (rank 0) and the rank exchange (all ranks).
  void record_metrics(const StepRecord& rec);
  void record_router_metrics();
  // Seconds this rank's communicators have spent blocked in wait() so far.
  double blocked_seconds() const;
  // The layout into the registry and a "start" event (rank 0).
  void announce_start();
  void log_line(const StepRecord& r);
  // Feeds the divergence guard; flags a loss spike in the metrics line.
  void watch_divergence(const StepRecord& rec, nlohmann::json& line);
  // checkpoint.every's save, unless the last step was skipped.
  void save_periodic_checkpoint(int64_t step);
  // Appends one line to metrics.jsonl; a failed write warns (once) and is counted.
  void write_metrics(std::ofstream& metrics, const nlohmann::json& line);
  // data.loss_on_answers: every target of one example's row but its answers
  // becomes -1 (ignored by the loss and the token count).
  void keep_only_answers(int32_t* row_targets) const;
  void fill_batches(int64_t step, std::vector<Tensor>& inputs, std::vector<Tensor>& targets,
                    std::vector<int64_t>& mb_tokens);
  void reduce_expert_loads();
  // Multimodal training (train/trainer_multimodal.cpp): the corpus and its
  // batches, per-task gradient scales from the balancer's weights, and the
  // step's per-task losses (all ranks), which update the balancer.
  void open_multimodal_corpus();
  void fill_multimodal_batches(int64_t step, std::vector<Tensor>& inputs,
                               std::vector<Tensor>& targets, std::vector<int64_t>& mb_tokens);
  void scale_tasks(double loss_scale);
  void finish_tasks(StepRecord& rec);
  double evaluate_multimodal();
  // After a step, before the routers move on: the per-modality expert
  // loads summed over the stage and each modality's loss (the mean of its
  // tasks') go to the MoE layers' adaptive allocation; the loads and any
  // move go into the metrics line.
  void adapt_modality_routing(const StepRecord& rec, nlohmann::json& line);
  // The allocation states feedback_slices loaded, into the layers.
  void load_modality_allocation();
  // The global gradient norm: under expert parallelism the expert
  // gradients' squares are summed over the ep group (each expert counted once).
  double grad_norm(double grad_scale);
  bool writes_checkpoint_tensor(const std::string& name) const;
  void balance_checkpoint_writers();
  // Bytes this rank put on the wire for gradients and ZeRO-1 gathers so far.
  int64_t gradient_bytes_sent() const;
  void for_each_reducer(const std::function<void(parallel::GradReducer&)>& fn);
  // State saved beside the optimizer's (train/trainer_feedback.cpp): the
  // router biases, and with `residuals` the error-feedback residuals, by
  // parameter and named for folding (ckpt/folded_state.h).
  std::vector<optim::StateSlice> feedback_slices(bool saving, bool residuals = true);
  // Whether checkpoint `dir` was saved by this layout (dp, tp, ep, pp, cp).
  bool saved_layout_matches(const std::string& dir) const;
  // After a resize of dp only: each rank adds the saved residuals that fold
  // onto it, so every reduction group's pending error is kept. After any
  // other change of layout the residuals start from zero (with a notice).
  void fold_residuals(const std::string& dir);
  // Gradient compression's automatic start (parallel.compression_start =
  // "auto"): fed each step's gradient norm until it starts compression.
  void advance_compression(const StepRecord& rec, nlohmann::json& line);
  // Compression from step `first` on (every reducer; AdamW's second moment
  // frozen after step first - 1 with parallel.freeze_variance).
  // restored_scales: on resume, trainer.json's per-tensor preconditioner
  // scales; nullptr when compression starts now.
  void start_compression(int64_t first, const nlohmann::json* restored_scales = nullptr);
  // parallel.compression_space = "preconditioned": every reducer divides by
  // AdamW's denominator (parallel/grad_reducer.h). With freeze_variance and
  // `fresh`, the denominators are floored and stored back as the frozen v;
  // with a live v they are floored and refreshed at every step.
  // Collective over dp.
  void build_preconditioners(const nlohmann::json& saved_scales, bool fresh);
  // With a live second moment (no freeze_variance), before step `step`'s
  // reductions: the denominators of the v after step - 1, floored, no
  // communication (the optimizer is replicated over dp).
  void refresh_preconditioners(int64_t step);
  // Every reducer's d from this rank's AdamW second moments (v after step
  // v_step), completed by finish_preconditioner(saved, collective).
  void load_denominators(int64_t v_step, const std::unordered_map<std::string, float>& saved,
                         bool collective);
  // The reducers' per-tensor preconditioner scales, by parameter name.
  std::unordered_map<std::string, float> tensor_scales();
  // trainer.json's "compression" entry, and its restore on resume.
  nlohmann::json compression_state();
  void restore_compression(const nlohmann::json& trainer_state);
  bool is_root() const { return world_->rank() == 0; }
  double flops_per_token() const;

  Config cfg_;
  std::string run_dir_;
  std::shared_ptr<comm::Communicator> world_;
  nn::Precision prec_;
  std::unique_ptr<kernels::Context> ctx_;
  std::unique_ptr<data::TokenFile> train_tokens_, val_tokens_;
  std::unique_ptr<data::WindowSampler> sampler_;
  int32_t document_separator_ = -1;  // the corpus's eos_id under data.document_mask
  int64_t answer_tokens_ = 0;        // data.loss_on_answers: targets counted per example
  std::unique_ptr<parallel::TrainingPlan> plan_;
  parallel::RankPlan rank_;
  // The replica that writes each replicated parameter (and its optimizer
  // state) to checkpoints and snapshots: see writes_checkpoint_tensor.
  std::unordered_map<std::string, int> writer_of_;
  std::unique_ptr<MeasuredStageCosts> measured_;  // parallel.stage_balance = measured (pp > 1)
  const parallel::RankCoords& at() const { return rank_.coords; }
  // Whether this rank is the first of the tp ranks that compute the same
  // losses: of its tp group, or under a 2-D grid of its grid row (the rows
  // hold different rows of the micro-batch).
  bool first_of_tp_row() const {
    const parallel::PlanSettings& s = plan_->settings();
    return at().tp % (s.tp / s.tp_rows) == 0;
  }
  int64_t tp() const { return plan_->settings().tp; }
  int64_t ep() const { return plan_->settings().ep; }
  int64_t pp() const { return plan_->settings().pp; }

  // Communicators: the plan's groups (comm::ProcessMesh over its dense and
  // expert meshes). Each carries one kind of traffic, so its counters tell
  // that traffic apart: tp (the model's tensor-parallel collectives), ep
  // (the MoE token exchange), pp (stage-to-stage activations), stage (loss
  // sums, expert loads), balance (MoE statistics), and one per reducer.
  std::unique_ptr<comm::ProcessMesh> dense_mesh_, expert_mesh_;
  comm::Communicator* tp_comm_ = nullptr;
  comm::Communicator* cp_comm_ = nullptr;  // the context-parallel ring (parallel.cp > 1)
  comm::Communicator* ep_comm_ = nullptr;
  comm::Communicator* pp_comm_ = nullptr;
  comm::Communicator* stage_comm_ = nullptr;
  std::unique_ptr<comm::Communicator> balance_comm_;
  std::unique_ptr<comm::Communicator> grad_comm_;  // dense gradients and ZeRO-1 gathers over dp
  std::unique_ptr<comm::Communicator> partial_grad_comm_;  // tp-partial gradients over the stage
  std::unique_ptr<comm::Communicator> expert_grad_comm_;   // expert gradients over their replicas
  comm::Communicator& stage() { return *stage_comm_; }

  std::unique_ptr<nn::Transformer> model_;
  std::unique_ptr<PipelineRunner> pipeline_;
  std::unique_ptr<parallel::GradReducer> reducer_;  // dense (dp > 1 or ZeRO-1)
  std::unique_ptr<parallel::GradReducer>
      partial_reducer_;  // router, shared experts, norms under sp (tp > 1)
  std::unique_ptr<parallel::GradReducer> expert_reducer_;  // routed experts' replicas (ep > 1)
  std::unique_ptr<optim::ParamOptimizer> opt_;
  std::unique_ptr<CompressionStart> compression_start_;  // "auto" start, until it has fired
  int64_t compression_started_at_ = 0;                   // first compressed step (0: none yet)
  std::vector<optim::ZeroOptimizer*>
      zero_parts_;  // ZeRO-1's parts of opt_ (dense over dp, tp-partial over the stage)
  int64_t acc_ = 1;
  bool fp16_ = false;
  optim::LossScaler scaler_;
  int64_t start_step_ = 0;
  int64_t skipped_ = 0;
  DivergenceGuard guard_;
  bool spiking_ = false;  // the last step's loss was a spike
  int64_t metrics_failures_ = 0;
  double peak_flops_ = 0;  // measured on the first run() (train/peak_flops.h)
  std::unique_ptr<TrainerMonitor> monitor_;
  std::unique_ptr<comm::Communicator> snapshot_comm_;  // carries only snapshot traffic
  std::unique_ptr<ckpt::SnapshotStore> snapshots_;
  std::unique_ptr<ckpt::AsyncPersister> persister_;
  int snapshot_probes_ = 0;  // snapshots taken while the interval is undecided
  // The slowest rank's {snapshot, step, write, exchange, agree} seconds of each probe.
  std::vector<std::array<double, 5>> snapshot_samples_;
  int64_t snapshot_every_ = 0;  // 0: no snapshots; -1: decided on the third
  int64_t last_snapshot_ = -1;
  bool snapshot_room_checked_ = false;
  bool stop_requested_ = false;  // agreed by every rank with the step's token counts
  // Multimodal: this step's micro-batches, the target tokens of each task
  // over the whole step (all ranks), this rank's per-task sums (ce counted
  // once per tp group), and the balancer of the task weights.
  std::unique_ptr<MultimodalBatcher> batcher_;
  std::vector<std::shared_ptr<nn::MultimodalBatch>> mm_batches_;
  std::vector<int64_t> step_task_tokens_;
  double step_media_flops_ =
      0;  // the step's encoders and cross-attention, all ranks (nn/media_flops.h)
  nn::LossStats task_stats_;
  std::unique_ptr<MultitaskBalancer> balancer_;
  std::vector<double> modality_loss_;       // the last known loss of each modality
  std::vector<Tensor> allocation_buffers_;  // per MoE layer (partitioned routing)
};

}  // namespace moetron::train
