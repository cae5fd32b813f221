// The single-process training loop: deterministic sampling, gradient
// accumulation normalised by the step's total token count, periodic
// validation, metrics (JSON lines), progress lines, checkpoints and resume.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/data/token_dataset.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/loss_scaler.h"
#include "moetron/optim/optimizer.h"
#include "moetron/parallel/grad_reducer.h"
#include "moetron/train/pipeline_runner.h"
#include "moetron/train/config.h"

namespace moetron::optim {
class ZeroOptimizer;
}

namespace moetron::train {

// bf16 where the CPU has AVX512-BF16, else fp32 (`auto`); explicit values are
// honoured. fp16 (with dynamic loss scaling) stores activations and weights'
// working copies in fp16; on a CPU without fp16 arithmetic the kernels compute
// in fp32 on staged copies (kernels/f16_staging.h), and `notice` says so.
// train.grad_dtype = bf16 turns on the bf16 matrix gradients.
nn::Precision resolve_precision(const TrainingConfig& train, std::string* notice);

struct StepRecord {
  int64_t step = 0;
  double loss = 0;  // mean token cross-entropy of the step
  double aux_loss = 0, z_loss = 0;
  double lr = 0, grad_norm = 0;
  double tokens_per_s = 0, mfu = 0;
  double loss_scale = 1;
  int64_t tokens = 0;
  int64_t dropped = 0;  // (token, expert) slots dropped by the capacity factor, all MoE layers
  bool skipped = false;
  // Data parallelism: seconds from the end of backward to the start of the
  // optimizer, blocked on gradient reductions (the exposed communication),
  // and the whole step's wall time.
  double comm_wait_s = 0, step_s = 0;
  double pipeline_wait_s = 0;  // pp > 1: blocked on stage-to-stage transfers (bubble + transfer)
};

struct TrainResult {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;
  double final_loss_scale = 1;  // fp16 only
  double first_loss = 0, last_loss = 0;
  double val_loss = 0;  // last validation loss (NaN if never evaluated)
  std::vector<StepRecord> history;
  // This rank's allocator after the first step's update: peaks per tag over
  // the step, with everything built before it (what planner::estimate_memory predicts).
  MemStats first_step_memory;
};

class Trainer {
 public:
  // world: every rank of the job (nullptr: one local rank). Ranks of a
  // data-parallel run each read their slice of the global batch.
  Trainer(Config cfg, std::string run_dir, bool resume,
          std::shared_ptr<comm::Communicator> world = nullptr);
  ~Trainer();
  TrainResult run();

  // Mean validation cross-entropy over cfg.train.eval_batches deterministic windows.
  double evaluate();
  nn::Transformer& model() { return *model_; }
  optim::ParamOptimizer& optimizer() { return *opt_; }
  comm::Communicator& world() { return *world_; }
  // The data-parallel gradient reducer (nullptr on one rank without ZeRO-1);
  // its communicator carries exactly the gradient and ZeRO-1 parameter traffic.
  parallel::GradReducer* reducer() { return reducer_.get(); }
  // The expert-parallel group (nullptr when parallel.ep = 1): it carries
  // exactly the MoE token exchange (and the per-expert count all-gather).
  comm::Communicator* expert_comm() { return ep_comm_.get(); }
  comm::Communicator* tensor_comm() { return tp_comm_.get(); }
  comm::Communicator* pipeline_comm() { return pp_comm_.get(); }
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

 private:
  void log_line(const StepRecord& r);
  void fill_batches(int64_t step, std::vector<Tensor>& inputs, std::vector<Tensor>& targets,
                    std::vector<int64_t>& mb_tokens);
  void reduce_expert_loads();
  // The global gradient norm: under expert parallelism the expert
  // gradients' squares are summed over the ep group (each expert counted once).
  double grad_norm(double grad_scale);
  bool writes_checkpoint_tensor(const std::string& name) const;
  // Bytes this rank put on the wire for gradients and ZeRO-1 gathers so far.
  int64_t gradient_bytes_sent() const;
  void for_each_reducer(const std::function<void(parallel::GradReducer&)>& fn);
  std::vector<optim::StateSlice> feedback_slices(bool saving);
  bool is_root() const { return world_->rank() == 0; }
  double flops_per_token() const;

  Config cfg_;
  std::string run_dir_;
  std::shared_ptr<comm::Communicator> world_;
  nn::Precision prec_;
  std::unique_ptr<kernels::Context> ctx_;
  std::unique_ptr<data::TokenFile> train_tokens_, val_tokens_;
  std::unique_ptr<data::WindowSampler> sampler_;
  std::unique_ptr<nn::Transformer> model_;
  std::unique_ptr<comm::Communicator> balance_comm_;  // MoE statistics, apart from gradient traffic
  std::unique_ptr<comm::Communicator> grad_comm_;    // gradient buckets and ZeRO-1 gathers
  std::unique_ptr<parallel::GradReducer> reducer_;   // dp > 1 or ZeRO-1 (with ep > 1: dense parameters)
  int64_t ep_ = 1;
  std::unique_ptr<comm::Communicator> ep_comm_;            // the ep ranks sharing one copy of the experts
  std::unique_ptr<comm::Communicator> expert_grad_comm_;   // the dp / ep ranks holding the same experts
  std::unique_ptr<parallel::GradReducer> expert_reducer_;  // expert gradients over expert_grad_comm_
  // Tensor parallelism: rank = dp_rank * tp + tp_rank.
  int64_t tp_ = 1;
  int64_t dp_ = 1;
  std::unique_ptr<comm::Communicator> tp_comm_;              // the tp ranks sharing a micro-batch
  std::unique_ptr<comm::Communicator> partial_grad_comm_;    // every rank: gradients partial over tp
  std::unique_ptr<parallel::GradReducer> partial_reducer_;   // router, shared experts, norms under sp
  // Pipeline parallelism: rank = pp_rank * stage_size + stage_rank; dp, tp
  // and ep live inside a stage (stage_comm_).
  int64_t pp_ = 1;
  std::unique_ptr<comm::Communicator> stage_comm_;  // the ranks of this stage
  std::unique_ptr<comm::Communicator> pp_comm_;     // this position in every stage
  std::unique_ptr<PipelineRunner> pipeline_;
  std::vector<std::pair<int64_t, int64_t>> stages_;  // vpp 1: every stage's layers [first, end)
  comm::Communicator& stage() { return stage_comm_ ? *stage_comm_ : *world_; }
  int64_t stage_size() const { return world_->size() / pp_; }
  int64_t stage_rank() const { return world_->rank() % stage_size(); }
  int64_t pp_rank() const { return world_->rank() / stage_size(); }
  int64_t dp_rank() const { return stage_rank() / tp_; }
  int64_t tp_rank() const { return stage_rank() % tp_; }

  std::unique_ptr<optim::ParamOptimizer> opt_;
  std::vector<optim::ZeroOptimizer*> zero_parts_;  // ZeRO-1's parts of opt_ (dense over dp, tp-partial over the stage)
  int64_t acc_ = 1;
  bool fp16_ = false;
  optim::LossScaler scaler_;
  int64_t start_step_ = 0;
  int64_t skipped_ = 0;
  double peak_flops_ = 0;
};

}  // namespace moetron::train
