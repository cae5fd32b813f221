// The TrainingPlan: every decision about how a job's ranks split the work,
// made once from typed settings and the world size, before anything is
// allocated or any rank talks to another. The trainer instantiates it
// (communicators from its groups, the model from its pipeline place,
// reducers from its bucket plans, ZeRO-1 over its reduce-scatter groups);
// the memory model (planner/) and `moetron plan` read the same plan, so
// what is predicted and printed is what the ranks run.
//
// Rank order (comm::ProcessMesh, innermost first): tp, cp, dp, pp for the
// dense layers; the MoE layers fold the stage's dp x cp x tp ranks into
// ep x edp (Megatron-Core's "parallel folding": ep groups are consecutive
// ranks of a stage, edp the ranks holding the same experts, so the cp ranks
// fold into the expert-data-parallel group). The cp ranks of a replica
// split its sequences (nn/context_parallel.h) and hold the same weights:
// dense gradients reduce over dp x cp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moetron/comm/process_mesh.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter_inventory.h"
#include "moetron/nn/transformer.h"
#include "moetron/parallel/bucket_plan.h"
#include "moetron/parallel/grad_reducer.h"
#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::parallel {

// Every string setting that shapes a layout, parsed into a type. Parsers
// throw naming the config key and the allowed values.
enum class OptimizerKind { adamw, muon };
enum class MuonDistribution { owner, gather, replicated };
enum class StageBalance { flops, measured };

OptimizerKind parse_optimizer(const std::string& s);             // optim.name
MuonDistribution parse_muon_distribution(const std::string& s);  // optim.muon_distribution
StageBalance parse_stage_balance(const std::string& s);          // parallel.stage_balance
DType parse_storage_dtype(const std::string& s, const char* key);
// optim.moment_dtype: "fp32", "bf16" or "int8" (8-bit block-quantised
// state, held as u8 codes: kernels/quantized_state.h); throws naming `key`.
DType parse_moment_dtype(const std::string& s, const char* key);  // "fp32" | "bf16"
const char* name_of(OptimizerKind k);
const char* name_of(MuonDistribution k);
const char* name_of(StageBalance k);

using LayerRange = std::pair<int64_t, int64_t>;  // layers [first, end)

struct PlanSettings {
  nn::ModelConfig model;
  nn::MoeConfig moe;
  nn::MultimodalModelConfig media;  // the encoders (multimodal.enabled) on the first stage
  nn::Precision precision = nn::Precision::fp32();
  // Layout: dp = world / (pp tp cp); ep groups cut from each stage's dp x cp x tp ranks.
  int64_t tp = 1, ep = 1, pp = 1, vpp = 1, cp = 1;
  // 2-D tensor parallelism (parallel.tp_2d = "RxC"): tp = R x C, tp_rows = R
  // (nn/tensor_parallel_2d.h); 1: 1-D.
  int64_t tp_rows = 1;
  bool sequence_parallel = false;
  bool zero = false;  // ZeRO-1
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  StageBalance stage_balance = StageBalance::flops;
  // Batch: rows per micro-batch per rank, and how many micro-batches a step takes.
  int64_t micro_batch = 1, seq_len = 1;
  int64_t grad_accum = 1, global_batch = 0, microbatches = 0;
  // What shapes buckets and optimizer state.
  OptimizerKind optimizer = OptimizerKind::adamw;
  MuonDistribution muon_distribution = MuonDistribution::owner;
  std::vector<std::string> adamw_patterns;  // kept on AdamW under muon
  DType moment_dtype = DType::f32;
  DType master_dtype = DType::f32;      // of the bf16 parameters (optim.master_dtype)
  bool factored_second_moment = false;  // optim.second_moment = "factored"
  ReducerOptions reducer;               // mode is decided by the plan (reduce_scatter under ZeRO-1)
  bool overlap_param_gather = true;
};

// The tensor parallelism the modules of tp rank `tp_rank` are built with:
// 1-D over tp ranks, or under a 2-D grid the rank's grid row (C = tp /
// tp_rows ranks, sequence parallel) with the grid fields set. Communicators
// are left unset.
nn::TensorParallel module_tensor_parallel(const PlanSettings& s, int64_t tp_rank);

// Micro-batches per step on each of `dp` ranks (from train.global_batch,
// parallel.microbatches or train.grad_accum); throws naming the key that
// disagrees.
int64_t accumulation_steps(const PlanSettings& s, int64_t dp);

// Which reducer carries a parameter's gradient: routed experts under ep over
// the ranks holding the same experts; gradients partial over tp (router,
// shared experts, norms under sp) over the stage; the rest over dp.
enum class GradGroup { expert, partial, dense };
const char* name_of(GradGroup g);

// The communicator groups a rank belongs to. dp: the ranks holding the same
// dense weights (dp x cp: the dense gradients' reducer); cp: the ring that
// splits each sequence; stage: every rank of a pipeline stage.
enum class Group { tp, dp, pp, stage, ep, expert_dp, cp };
const char* name_of(Group g);

struct RankCoords {
  int rank = 0;
  int pp = 0, dp = 0, tp = 0, cp = 0;  // dense mesh
  int ep = 0, edp = 0;                 // expert mesh (within the stage)
  int stage_rank = 0;                  // (dp * cp_size + cp) * tp_size + tp: place in the stage
  bool operator==(const RankCoords&) const = default;
};

// One GradReducer: its group, mode and buckets (indices into the rank's
// inventory). A reduce_scatter reducer's chunks are ZeRO-1's shards.
struct ReducerPlan {
  GradGroup carries = GradGroup::dense;
  Group over = Group::dp;
  int size = 1;
  ReducerOptions options;
  std::vector<PlannedBucket> buckets;
};

struct RankPlan {
  RankCoords coords;
  nn::PipelinePlace place;
  nn::ParamInventory inventory;       // what the model registers on this rank
  std::vector<ReducerPlan> reducers;  // expert, partial, dense: those this layout has
  const ReducerPlan* reducer(GradGroup g) const;
};

class TrainingPlan {
 public:
  // stages: the pipeline split (vpp 1) when measured costs chose it; empty:
  // balanced by FLOPs. Throws naming the key when the layout does not fit
  // world_size ranks.
  TrainingPlan(PlanSettings settings, int world_size, std::vector<LayerRange> stages = {});

  const PlanSettings& settings() const { return s_; }
  int world_size() const { return world_; }
  int64_t dp() const { return dp_; }
  // Ranks holding the same dense weights: dp x cp.
  int64_t replicas() const { return dp_ * s_.cp; }
  int64_t stage_size() const { return stage_size_; }
  int64_t accumulation() const { return acc_; }
  // vpp 1: every stage's layers; vpp > 1: empty (see chunks()).
  const std::vector<LayerRange>& stages() const { return stages_; }
  std::vector<LayerRange> chunks(int64_t pp_rank) const;
  nn::PipelinePlace place(int64_t pp_rank) const;

  comm::MeshShape dense_mesh() const;   // pp x dp x cp x tp
  comm::MeshShape expert_mesh() const;  // pp x edp x ep
  RankCoords coords(int rank) const;
  std::vector<int> group(Group g, int rank) const;  // world ranks, in communicator order
  bool has_group(Group g) const;                    // whether the trainer builds it

  bool uses_muon(const nn::ParamInfo& p) const;
  GradGroup grad_group(const nn::ParamInfo& p) const;
  // The rank's parameters (predicted, nothing allocated) and reducers.
  RankPlan rank_plan(int rank) const;

 private:
  ReducerPlan reducer_plan(GradGroup g, const nn::ParamInventory& inv) const;
  PlanSettings s_;
  int world_ = 1;
  int64_t dp_ = 1, stage_size_ = 1, acc_ = 1;
  std::vector<LayerRange> stages_;
};

}  // namespace moetron::parallel
