// The parameters a model instance registers, described without allocating
// them: names, shapes, dtypes, how tensor and expert parallelism place them,
// and the buffers they live in. The training plan routes gradients and
// builds bucket plans from this description, and the memory model counts
// its bytes, so both read the model as the Transformer builds it.
// tests/nn/parameter_inventory_test.cpp holds parameter_inventory() equal,
// field by field, to describe_parameters() of a built model on every
// layout (tp, sp, ep, pipeline chunks, precision modes).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moetron/core/dtype.h"
#include "moetron/core/shape.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/multimodal_config.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/tensor_parallel.h"

namespace moetron::nn {

struct PipelinePlace;

// What a layout needs to know of one nn::Parameter.
struct ParamInfo {
  std::string name;
  Shape shape;  // this rank's value (a tp shard's block)
  DType value = DType::f32, grad = DType::f32;
  ParallelKind kind = ParallelKind::replicated;
  bool hidden_matrix = false;
  int64_t expert = -1;
  bool grad_partial_over_tp = false;
  Shape full;  // tp-sharded: the whole tensor's shape (rank 0 otherwise)
  int64_t row0 = 0, col0 = 0;
  bool primary = true;

  int64_t numel() const { return shape.numel(); }
  bool sharded() const { return full.rank() > 0; }
  int64_t rows() const { return shape.rank() == 2 ? shape[0] : 0; }
  int64_t cols() const { return shape.rank() == 2 ? shape[1] : 0; }
  bool operator==(const ParamInfo&) const = default;
};

struct ParamInventory {
  std::vector<ParamInfo> params;  // in registration order (views included)
  // The allocations behind them, in order (elements, dtype): tag params and
  // tag grads. A fused buffer (gate and up, an MoE layer's experts) is one
  // allocation holding several parameters; the router's selection bias is a
  // params allocation with no parameter.
  std::vector<std::pair<int64_t, DType>> value_buffers, grad_buffers;
};

// What Transformer(model, moe, prec, ep, tp, place) registers on this rank,
// and with `media` (enabled) what its enable_media(*media) adds.
ParamInventory parameter_inventory(const ModelConfig& model, const MoeConfig& moe, Precision prec,
                                   ExpertParallel ep, const TensorParallel& tp,
                                   const PipelinePlace& place,
                                   const MultimodalModelConfig* media = nullptr);

// The description of a built model's parameters.
std::vector<ParamInfo> describe_parameters(const ParameterSet& params);

// "" when equal, else the first difference ("parameter 3 'name': shape [4, 8] vs [4, 4]").
std::string first_difference(const std::vector<ParamInfo>& a, const std::vector<ParamInfo>& b);

}  // namespace moetron::nn
