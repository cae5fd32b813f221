// Pipeline parallelism's plan: which layers each pipeline rank holds and
// the order in which it runs forward and backward of its micro-batches
// (train/pipeline_runner.h executes it; planner/memory_model.h replays it).
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

#include "moetron/nn/model_config.h"

namespace moetron::parallel {

struct PipeOp {
  bool forward = true;
  int64_t mb = 0;
  int64_t chunk = 0;
};

// gpipe | 1f1b (with v > 1: interleaved 1F1B).
enum class ScheduleKind { one_f_one_b, gpipe };
// parallel.schedule's text; throws naming the key.
ScheduleKind parse_schedule(const std::string& s);
const char* name_of(ScheduleKind k);

std::vector<PipeOp> pipeline_schedule(ScheduleKind kind, int64_t pp, int64_t rank,
                                      int64_t microbatches, int64_t v);
// The same with kind given as text ("gpipe" | "1f1b").
std::vector<PipeOp> pipeline_schedule(const std::string& kind, int64_t pp, int64_t rank,
                                      int64_t microbatches, int64_t v);
// The idle fraction of an ideal pipeline: (pp - 1) / (v m + pp - 1).
double ideal_bubble_fraction(int64_t pp, int64_t microbatches, int64_t v);
// Event simulation of every rank's schedule, each receive blocking until the
// sending stage finished: a virtual stage's forward takes `forward` / v and
// its backward `backward` / v time units per micro-batch, and each hop
// between ranks `hop`. Returns the makespan; throws if the schedule
// deadlocks (a rank waits on an op nobody will run).
double simulate_schedule(ScheduleKind kind, int64_t pp, int64_t microbatches, int64_t v,
                         double forward = 1, double backward = 2, double hop = 0);

// The same simulation, op by op: when each of a rank's ops starts and ends.
struct TimedOp {
  PipeOp op;
  double start = 0, end = 0;
};
std::vector<std::vector<TimedOp>> simulate_schedule_timeline(ScheduleKind kind, int64_t pp,
                                                             int64_t microbatches, int64_t v,
                                                             double forward = 1,
                                                             double backward = 2, double hop = 0);

// What each piece of the model costs a stage, in any unit: every layer, the
// embedding (on the first stage) and the final norm, head and loss (on the last).
struct StageCosts {
  std::vector<double> layers;
  double embedding = 0, head = 0;
};
// Training FLOPs per token (nn::layer_flops_per_token, nn::head_flops_per_token;
// the embedding gather counted as free).
StageCosts flop_stage_costs(const nn::ModelConfig& m, const nn::MoeConfig& e, int64_t seq_len);

// Layers [first, end) of each of pp stages: contiguous, at least one each,
// minimising the largest stage's cost.
std::vector<std::pair<int64_t, int64_t>> balanced_stages(const StageCosts& costs, int64_t pp);
// Balanced by training FLOPs (flop_stage_costs).
std::vector<std::pair<int64_t, int64_t>> balanced_stages(const nn::ModelConfig& m,
                                                         const nn::MoeConfig& e, int64_t seq_len,
                                                         int64_t pp);

// The layer chunks [first, end) pipeline rank `rank` holds: one
// FLOP-balanced stage, or with vpp > 1 the interleaved virtual stages
// c * pp + rank of L / (pp vpp) layers each.
std::vector<std::pair<int64_t, int64_t>> stage_chunks(const nn::ModelConfig& m,
                                                      const nn::MoeConfig& e, int64_t seq_len,
                                                      int64_t pp, int64_t vpp, int64_t rank);

}  // namespace moetron::parallel
