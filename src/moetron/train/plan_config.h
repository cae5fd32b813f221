// From a validated Config to the typed settings and the TrainingPlan
// (parallel/training_plan.h): the one place where the config's strings
// become types, so nothing past it compares a setting's text.
#pragma once

#include <string>
#include <vector>

#include "moetron/optim/optimizer.h"
#include "moetron/parallel/training_plan.h"
#include "moetron/train/config.h"

namespace moetron::train {

// bf16 where the CPU has AVX512-BF16, else fp32 (`auto`); explicit values are
// honoured. fp16 (with dynamic loss scaling) stores activations and weights'
// working copies in fp16; on a CPU without fp16 arithmetic the kernels compute
// in fp32 on staged copies (kernels/f16_staging.h), and `notice` says so.
// train.grad_dtype = bf16 turns on the bf16 matrix gradients.
nn::Precision resolve_precision(const TrainingConfig& train, std::string* notice);

// The plan's settings for `cfg` trained at `prec`.
parallel::PlanSettings plan_settings(const Config& cfg, const nn::Precision& prec);
// The plan of a job of world_size ranks; stages: a measured pipeline split
// (empty: by FLOPs).
parallel::TrainingPlan make_plan(const Config& cfg, const nn::Precision& prec, int world_size,
                                 std::vector<parallel::LayerRange> stages = {});
// The optimizer's options (the plan's optimizer kind and moment dtype, the
// config's hyper-parameters and schedule).
optim::OptimizerOptions optimizer_options(const Config& cfg, const parallel::PlanSettings& s);

}  // namespace moetron::train
