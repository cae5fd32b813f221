// Pipeline parallelism's runner: executes a rank's schedule
// (parallel/pipeline_schedule.h) over the model's chunks, with the stages'
// activations and gradients travelling by non-blocking send and blocking
// receive.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/nn/transformer.h"
#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::train {

class PipelineRunner {
 public:
  // pp_group: the pp ranks at this position of every stage, ordered by stage.
  PipelineRunner(nn::Transformer& model, comm::Communicator& pp_group,
                 parallel::ScheduleKind schedule, int64_t vpp);

  struct StepResult {
    // Summed over this rank's micro-batches (losses on the last stage); the
    // balancing losses weighted by loss_weights.
    nn::LossStats stats;
    double wait_s = 0;  // blocked on receives and on sends completing: the bubble plus transfers
    // Compute and transfers of the forward and backward ops (wait included).
    double forward_s = 0, backward_s = 0;
  };
  // One optimizer step's micro-batches. grad_scale, loss_weights[m] as for
  // Transformer::forward_backward; before_backward runs once, before the
  // first backward (arms the gradient reducers).
  StepResult train_step(kernels::Context& ctx, const std::vector<Tensor>& inputs,
                        const std::vector<Tensor>& targets, double grad_scale,
                        const std::vector<double>& loss_weights,
                        const std::function<void()>& before_backward);
  // Forward only (evaluation) of one batch through every stage.
  nn::LossStats forward_only(kernels::Context& ctx, const Tensor& inputs, const Tensor& targets);
  // Multimodal batches (nn/multimodal_batch.h): micro-batch m of the next
  // train_step is multimodal[m] (forward_only: multimodal[0]); empty: text.
  std::vector<std::shared_ptr<const nn::MultimodalBatch>> multimodal;

 private:
  nn::Transformer& model_;
  comm::Communicator& pp_;
  parallel::ScheduleKind schedule_;
  int64_t v_;
  int64_t stages() const { return pp_.size() * v_; }
  int64_t virtual_stage(int64_t chunk) const { return chunk * pp_.size() + pp_.rank(); }
  int64_t activation_rows(int64_t tokens) const;
  // This rank's rows of a micro-batch: all of them, or under context
  // parallelism its chunks (nn::Transformer::context_slice).
  nn::Transformer::ContextSlice share_of(const Tensor& ids, const Tensor& targets) const;
  int tag(int64_t mb, int64_t stage, bool forward) const;
  double wait_s_ = 0;
  std::vector<std::pair<std::unique_ptr<comm::Work>, Tensor>> sends_;
  Tensor receive(int64_t rows, int peer, int tag);
  void send(const Tensor& t, int peer, int tag);
  void finish_sends();
};

}  // namespace moetron::train
