// Per-layer statistics of the parameters for monitoring: gradient,
// parameter and update norms by (layer, matrix group), and each block's
// activation RMS, with every element counted once over the world whatever
// the layout (dp replicas, tp shards and replicated kv heads, ep experts and
// their replicas, pp stages).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/nn/transformer.h"
#include "moetron/parallel/training_plan.h"

namespace moetron::train {

// "model.layers.3.self_attn.q_proj.weight" -> {"3", "self_attn.q_proj"};
// an expert's matrix drops its index ("experts.w1"); the embedding is layer
// "embed", the final norm and head are layer "head".
std::pair<std::string, std::string> layer_group_of(const std::string& param_name);

struct GroupNorms {
  std::string layer, group;
  double grad = 0, param = 0, update = 0;  // L2 norms over the whole model
  bool has_grad = true;                    // false where ZeRO-1 holds the gradient in its chunks
  bool has_update = false;                 // monitor.update_stats
};

class LayerStatistics {
 public:
  // The groups come from the whole model's parameter names, so every rank
  // lists them in the same order (the world all-reduce adds them up).
  LayerStatistics(const nn::ModelConfig& model, const nn::MoeConfig& moe,
                  const parallel::RankCoords& at);
  // Keeps a copy of the parameters this rank counts (the first replica of
  // each element), for update norms after the step.
  void keep_parameters(const nn::ParameterSet& params);
  // Collective over `world`. zero_held(p): ZeRO-1 keeps p's reduced
  // gradient in its chunks (its group shows no gradient norm).
  std::vector<GroupNorms> measure(kernels::Context& ctx, const nn::ParameterSet& params,
                                  double grad_scale, comm::Communicator& world,
                                  const std::function<bool(const nn::Parameter&)>& zero_held);
  // Each block's output RMS over the micro-batches since the last call
  // (collective over `world`); NaN for a layer no forward ran.
  std::vector<double> activation_rms(const nn::Transformer& model, bool sequence_parallel,
                                     comm::Communicator& world);

 private:
  bool counts_here(const nn::Parameter& p) const;

  std::vector<std::pair<std::string, std::string>> groups_;
  int64_t n_layers_ = 0;
  parallel::RankCoords at_;
  std::vector<Tensor> before_;  // parameters before the update, in params().all() order
};

}  // namespace moetron::train
