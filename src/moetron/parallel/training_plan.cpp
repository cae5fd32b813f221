#include "moetron/parallel/training_plan.h"

#include <fnmatch.h>

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::parallel {

namespace {

[[noreturn]] void bad_value(const char* key, const std::string& allowed, const std::string& got) {
  MOETRON_FAIL("invalid config: '", key, "': must be ", allowed, ", got \"", got, "\"");
}

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

}  // namespace

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "muon") return OptimizerKind::muon;
  bad_value("optim.name", "\"adamw\" or \"muon\"", s);
}

MuonDistribution parse_muon_distribution(const std::string& s) {
  if (s == "owner") return MuonDistribution::owner;
  if (s == "gather") return MuonDistribution::gather;
  if (s == "replicated") return MuonDistribution::replicated;
  bad_value("optim.muon_distribution", "owner, gather or replicated", s);
}

StageBalance parse_stage_balance(const std::string& s) {
  if (s == "flops") return StageBalance::flops;
  if (s == "measured") return StageBalance::measured;
  bad_value("parallel.stage_balance", "flops or measured", s);
}

DType parse_moment_dtype(const std::string& s, const char* key) {
  if (s == "int8") return DType::u8;
  if (s == "fp32" || s == "bf16") return parse_storage_dtype(s, key);
  bad_value(key, "fp32, bf16 or int8", s);
}

DType parse_storage_dtype(const std::string& s, const char* key) {
  if (s == "fp32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  bad_value(key, "fp32 or bf16", s);
}

const char* name_of(OptimizerKind k) {
  return k == OptimizerKind::muon ? "muon" : "adamw";
}
const char* name_of(MuonDistribution k) {
  return k == MuonDistribution::owner    ? "owner"
         : k == MuonDistribution::gather ? "gather"
                                         : "replicated";
}
const char* name_of(StageBalance k) {
  return k == StageBalance::measured ? "measured" : "flops";
}
const char* name_of(GradGroup g) {
  return g == GradGroup::expert ? "expert" : g == GradGroup::partial ? "tp-partial" : "dense";
}
const char* name_of(Group g) {
  constexpr const char* kNames[] = {"tp", "dp", "pp", "stage", "ep", "expert_dp", "cp"};
  return kNames[static_cast<size_t>(g)];
}

int64_t accumulation_steps(const PlanSettings& s, int64_t dp) {
  const int64_t m = s.microbatches;
  if (s.global_batch == 0) {
    MOETRON_CHECK(m == 0 || s.grad_accum == 1 || m == s.grad_accum, "parallel.microbatches = ", m,
                  " disagrees with train.grad_accum = ", s.grad_accum);
    return m > 0 ? m : s.grad_accum;
  }
  MOETRON_CHECK(s.global_batch % (s.micro_batch * dp) == 0, "train.global_batch = ", s.global_batch,
                " is not a multiple of train.micro_batch * dp = ", s.micro_batch, " * ", dp);
  const int64_t derived = s.global_batch / (s.micro_batch * dp);
  MOETRON_CHECK(m == 0 || m == derived, "parallel.microbatches = ", m,
                " disagrees with train.global_batch = ", s.global_batch,
                " / (train.micro_batch * dp = ", s.micro_batch, " * ", dp, ") = ", derived);
  return derived;
}

const ReducerPlan* RankPlan::reducer(GradGroup g) const {
  for (const ReducerPlan& r : reducers) {
    if (r.carries == g) return &r;
  }
  return nullptr;
}

TrainingPlan::TrainingPlan(PlanSettings settings, int world_size, std::vector<LayerRange> stages)
    : s_(std::move(settings)), world_(world_size) {
  MOETRON_CHECK(world_ >= 1, "a job needs at least one rank, got ", world_);
  MOETRON_CHECK(s_.cp >= 1, "parallel.cp must be >= 1, got ", s_.cp);
  MOETRON_CHECK(world_ % s_.pp == 0, "parallel.pp = ", s_.pp, " does not divide the ", world_,
                " ranks of this job");
  stage_size_ = world_ / s_.pp;
  const char* within = s_.pp > 1 ? "a pipeline stage" : "this job";
  MOETRON_CHECK(stage_size_ % s_.tp == 0, "parallel.tp = ", s_.tp, " does not divide the ",
                stage_size_, " ranks of ", within);
  MOETRON_CHECK(stage_size_ % (s_.tp * s_.cp) == 0, "parallel.tp * parallel.cp = ", s_.tp, " * ",
                s_.cp, " does not divide the ", stage_size_, " ranks of ", within);
  dp_ = stage_size_ / (s_.tp * s_.cp);
  MOETRON_CHECK(stage_size_ % s_.ep == 0, "parallel.ep = ", s_.ep, " does not divide the ",
                stage_size_, " ranks of ", within, " (ep groups are cut out of the dp x tp ranks)");
  acc_ = accumulation_steps(s_, dp_);
  if (s_.pp > 1) {
    for (int64_t r = 0; r < s_.pp;
         ++r) {  // the schedule's rules (interleaving needs acc % pp == 0)
      (void)pipeline_schedule(s_.schedule, s_.pp, r, acc_, s_.vpp);
    }
  }
  if (s_.vpp == 1) {
    stages_ =
        stages.empty() ? balanced_stages(s_.model, s_.moe, s_.seq_len, s_.pp) : std::move(stages);
    MOETRON_CHECK(static_cast<int64_t>(stages_.size()) == s_.pp, "a pipeline split of ",
                  stages_.size(), " stages for parallel.pp = ", s_.pp);
  } else {
    MOETRON_CHECK(
        stages.empty(),
        "interleaved stages (parallel.vpp > 1) hold equal layer counts: no split to give");
  }
}

std::vector<LayerRange> TrainingPlan::chunks(int64_t pp_rank) const {
  if (s_.pp == 1) return {{0, s_.model.n_layers}};
  if (s_.vpp == 1) return {stages_[at(pp_rank)]};
  return stage_chunks(s_.model, s_.moe, s_.seq_len, s_.pp, s_.vpp, pp_rank);
}

nn::PipelinePlace TrainingPlan::place(int64_t pp_rank) const {
  nn::PipelinePlace p;
  if (s_.pp == 1) return p;  // every layer, embedding and head
  p.chunks = chunks(pp_rank);
  p.embedding = pp_rank == 0;
  p.head = pp_rank == s_.pp - 1;
  return p;
}

comm::MeshShape TrainingPlan::dense_mesh() const {
  comm::MeshShape m;
  m[comm::Axis::pp] = static_cast<int>(s_.pp);
  m[comm::Axis::dp] = static_cast<int>(dp_);
  m[comm::Axis::tp] = static_cast<int>(s_.tp);
  m[comm::Axis::cp] = static_cast<int>(s_.cp);
  return m;
}

comm::MeshShape TrainingPlan::expert_mesh() const {
  comm::MeshShape m;
  m[comm::Axis::pp] = static_cast<int>(s_.pp);
  m[comm::Axis::dp] = static_cast<int>(stage_size_ / s_.ep);
  m[comm::Axis::ep] = static_cast<int>(s_.ep);
  return m;
}

RankCoords TrainingPlan::coords(int rank) const {
  MOETRON_CHECK(rank >= 0 && rank < world_, "rank ", rank, " of a ", world_, "-rank plan");
  const auto d = comm::mesh_coords(dense_mesh(), rank);
  const auto e = comm::mesh_coords(expert_mesh(), rank);
  RankCoords c;
  c.rank = rank;
  c.pp = d[static_cast<size_t>(comm::Axis::pp)];
  c.dp = d[static_cast<size_t>(comm::Axis::dp)];
  c.tp = d[static_cast<size_t>(comm::Axis::tp)];
  c.cp = d[static_cast<size_t>(comm::Axis::cp)];
  c.ep = e[static_cast<size_t>(comm::Axis::ep)];
  c.edp = e[static_cast<size_t>(comm::Axis::dp)];
  c.stage_rank = static_cast<int>((c.dp * s_.cp + c.cp) * s_.tp + c.tp);
  return c;
}

std::vector<int> TrainingPlan::group(Group g, int rank) const {
  using comm::Axis;
  switch (g) {
    case Group::tp:
      return comm::mesh_group(dense_mesh(), rank, {Axis::tp});
    case Group::dp:
      return comm::mesh_group(dense_mesh(), rank, {Axis::cp, Axis::dp});
    case Group::cp:
      return comm::mesh_group(dense_mesh(), rank, {Axis::cp});
    case Group::pp:
      return comm::mesh_group(dense_mesh(), rank, {Axis::pp});
    case Group::stage:
      return comm::mesh_group(dense_mesh(), rank, {Axis::tp, Axis::cp, Axis::dp});
    case Group::ep:
      return comm::mesh_group(expert_mesh(), rank, {Axis::ep});
    case Group::expert_dp:
      return comm::mesh_group(expert_mesh(), rank, {Axis::dp});
  }
  MOETRON_FAIL("unknown group");
}

bool TrainingPlan::has_group(Group g) const {
  switch (g) {
    case Group::tp:
      return s_.tp > 1;
    case Group::dp:
      return replicas() > 1 || s_.zero;
    case Group::cp:
      return s_.cp > 1;
    case Group::pp:
      return s_.pp > 1;
    case Group::stage:
      return stage_size_ > 1;
    case Group::ep:
      return s_.ep > 1;
    case Group::expert_dp:
      return s_.ep > 1 && stage_size_ / s_.ep > 1;
  }
  return false;
}

bool TrainingPlan::uses_muon(const nn::ParamInfo& p) const {
  // optim::rule_uses_muon's rule, on a description.
  if (s_.optimizer != OptimizerKind::muon || !p.hidden_matrix || p.shape.rank() != 2) return false;
  return std::none_of(
      s_.adamw_patterns.begin(), s_.adamw_patterns.end(),
      [&](const std::string& pat) { return ::fnmatch(pat.c_str(), p.name.c_str(), 0) == 0; });
}

GradGroup TrainingPlan::grad_group(const nn::ParamInfo& p) const {
  if (s_.ep > 1 && p.kind == nn::ParallelKind::expert) return GradGroup::expert;
  if (p.grad_partial_over_tp) return GradGroup::partial;
  return GradGroup::dense;
}

ReducerPlan TrainingPlan::reducer_plan(GradGroup g, const nn::ParamInventory& inv) const {
  ReducerPlan r;
  r.carries = g;
  r.options = s_.reducer;
  r.options.mode = s_.zero ? ReduceMode::reduce_scatter : ReduceMode::allreduce;
  r.over = g == GradGroup::expert    ? Group::expert_dp
           : g == GradGroup::partial ? Group::stage
                                     : Group::dp;
  r.size = static_cast<int>(g == GradGroup::expert    ? stage_size_ / s_.ep
                            : g == GradGroup::partial ? stage_size_
                                                      : replicas());
  // Replicas of whole experts are all-reduced: ZeRO-1 shards only what every dp rank holds.
  if (g == GradGroup::expert) r.options.mode = ReduceMode::allreduce;
  const ParamFilter carries = [this, g](const nn::ParamInfo& p) { return grad_group(p) == g; };
  const bool owner = g != GradGroup::expert && s_.zero && s_.optimizer == OptimizerKind::muon &&
                     s_.muon_distribution == MuonDistribution::owner;
  r.buckets = owner ? owner_bucket_plan(
                          inv.params, r.size, r.options.bucket_bytes,
                          [this](const nn::ParamInfo& p) { return uses_muon(p); }, carries)
                    : flat_bucket_plan(inv.params, r.size, r.options.bucket_bytes, carries);
  return r;
}

nn::TensorParallel module_tensor_parallel(const PlanSettings& s, int64_t tp_rank) {
  nn::TensorParallel tp;
  if (s.tp_rows <= 1) {
    tp.size = s.tp;
    tp.rank = tp_rank;
    tp.sequence_parallel = s.sequence_parallel;
    return tp;
  }
  MOETRON_CHECK(s.tp % s.tp_rows == 0, "parallel.tp_2d: ", s.tp_rows, " grid rows do not divide ",
                s.tp, " tp ranks");
  tp.size = s.tp / s.tp_rows;
  tp.rank = tp_rank % tp.size;
  tp.sequence_parallel = true;
  tp.grid_rows = s.tp_rows;
  tp.grid_row = tp_rank / tp.size;
  return tp;
}

RankPlan TrainingPlan::rank_plan(int rank) const {
  RankPlan rp;
  rp.coords = coords(rank);
  rp.place = place(rp.coords.pp);
  const nn::TensorParallel tp = module_tensor_parallel(s_, rp.coords.tp);
  rp.inventory =
      nn::parameter_inventory(s_.model, s_.moe, s_.precision,
                              nn::ExpertParallel{s_.ep, rp.coords.ep}, tp, rp.place, &s_.media);
  // A stage of one rank reduces nothing (unless ZeRO-1 shards over it).
  if (stage_size_ == 1 && !s_.zero) return rp;
  if (has_group(Group::expert_dp))
    rp.reducers.push_back(reducer_plan(GradGroup::expert, rp.inventory));
  if (s_.tp > 1) rp.reducers.push_back(reducer_plan(GradGroup::partial, rp.inventory));
  if (has_group(Group::dp)) rp.reducers.push_back(reducer_plan(GradGroup::dense, rp.inventory));
  return rp;
}

}  // namespace moetron::parallel
