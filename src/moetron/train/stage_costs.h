// Pipeline stage costs measured on this machine (parallel.stage_balance =
// "measured"): FLOPs miss what the head's softmax and loss, the MoE's
// routing and permutations, and memory-bound kernels cost, so a FLOP split
// leaves one stage waiting for another (bench/RESULTS.md, "Pipeline bubble").
//
// Each kind of layer (dense, MoE), the embedding and the head with its loss
// is timed on a one-layer probe of this model at the training micro-batch,
// forward and backward, in the training precision on this rank's threads;
// the ranks average their timings so every rank splits alike. Probes run
// without tp and ep: a stage's pieces scale alike under them to first order
// (attention, FFN and vocabulary by 1/tp), so the ratios that decide the
// split stand. A probe holds one layer with all its experts, which must fit
// on a rank; otherwise balance by "flops".
#pragma once

#include <string>

#include "moetron/comm/communicator.h"
#include "moetron/nn/parameter.h"
#include "moetron/parallel/pipeline_schedule.h"
#include "moetron/train/config.h"

namespace moetron::train {

struct MeasuredStageCosts {
  parallel::StageCosts costs;             // seconds per micro-batch, forward + backward
  double dense_layer = 0, moe_layer = 0;  // 0: the model has no layer of that kind
};

// Times the probes `repeats` times each (after one warm-up) and keeps the
// median; every rank of `world` measures and the means are returned on all
// (collective).
MeasuredStageCosts measure_stage_costs(const Config& cfg, const nn::Precision& prec,
                                       comm::Communicator& world, int repeats = 3);

// "layers [0, 3) [3, 4)" and what balanced them, for the log.
std::string describe_stages(const std::vector<std::pair<int64_t, int64_t>>& stages,
                            const MeasuredStageCosts* measured);

}  // namespace moetron::train
