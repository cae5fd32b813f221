// Pipeline parallelism: the order in which a pipeline rank runs forward and
// backward of its micro-batches, and the runner that executes that order
// with the stages' activations and gradients travelling by non-blocking
// send and blocking receive.
//
// Virtual stage j = chunk * pp + rank (chunk c of v on each rank holds
// layers of virtual stage c * pp + rank), so activations go rank 0 -> 1 ->
// ... -> pp-1 -> rank 0's next chunk. Schedules:
//   gpipe        every forward, then every backward;
//   1f1b         pp - rank - 1 warm-up forwards, then one forward and one
//                backward in turn, then the remaining backwards (PipeDream
//                flush: at most pp micro-batches in flight);
//   interleaved  1f1b over v chunks per rank (Megatron's schedule; needs
//                microbatches % pp == 0), bubble (pp-1)/(v m + pp-1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/nn/transformer.h"

namespace moetron::train {

struct PipeOp {
  bool forward = true;
  int64_t mb = 0;
  int64_t chunk = 0;
};

// kind: "gpipe" | "1f1b" (with v > 1: interleaved 1F1B).
std::vector<PipeOp> pipeline_schedule(const std::string& kind, int64_t pp, int64_t rank, int64_t microbatches,
                                      int64_t v);
// The idle fraction of an ideal pipeline: (pp - 1) / (v m + pp - 1).
double ideal_bubble_fraction(int64_t pp, int64_t microbatches, int64_t v);

// Layers [first, end) of each of pp stages: contiguous, at least one each,
// minimising the largest stage's training FLOPs per token
// (nn::layer_flops_per_token; the LM head's counted on the last stage, the
// embedding gather as free).
std::vector<std::pair<int64_t, int64_t>> balanced_stages(const nn::ModelConfig& m, const nn::MoeConfig& e,
                                                         int64_t seq_len, int64_t pp);

class PipelineRunner {
 public:
  // pp_group: the pp ranks at this position of every stage, ordered by stage.
  PipelineRunner(nn::Transformer& model, comm::Communicator& pp_group, std::string schedule, int64_t vpp);

  struct StepResult {
    // Summed over this rank's micro-batches (losses on the last stage); the
    // balancing losses weighted by loss_weights.
    nn::LossStats stats;
    double wait_s = 0;    // blocked on receives and on sends completing: the bubble plus transfers
  };
  // One optimizer step's micro-batches. grad_scale, loss_weights[m] as for
  // Transformer::forward_backward; before_backward runs once, before the
  // first backward (arms the gradient reducers).
  StepResult train_step(kernels::Context& ctx, const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
                        double grad_scale, const std::vector<double>& loss_weights,
                        const std::function<void()>& before_backward);
  // Forward only (evaluation) of one batch through every stage.
  nn::LossStats forward_only(kernels::Context& ctx, const Tensor& inputs, const Tensor& targets);

 private:
  nn::Transformer& model_;
  comm::Communicator& pp_;
  std::string schedule_;
  int64_t v_;
  int64_t stages() const { return pp_.size() * v_; }
  int64_t virtual_stage(int64_t chunk) const { return chunk * pp_.size() + pp_.rank(); }
  int64_t activation_rows(int64_t tokens) const;
  int tag(int64_t mb, int64_t stage, bool forward) const;
  double wait_s_ = 0;
  std::vector<std::pair<std::unique_ptr<comm::Work>, Tensor>> sends_;
  Tensor receive(int64_t rows, int peer, int tag);
  void send(const Tensor& t, int peer, int tag);
  void finish_sends();
};

}  // namespace moetron::train
