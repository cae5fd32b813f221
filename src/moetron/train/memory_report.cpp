#include "moetron/train/memory_report.h"

#include "moetron/comm/mpi_communicator.h"

#include <cstdio>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/kernels/matmul.h"
#include "moetron/optim/optimizer.h"
#include "moetron/train/plan_config.h"

namespace moetron::train {

planner::MemoryInputs memory_inputs(const Config& cfg, const parallel::TrainingPlan& plan, int rank,
                                    int64_t threads) {
  const parallel::PlanSettings& s = plan.settings();
  planner::MemoryInputs in;
  in.model = s.model;
  in.moe = s.moe;
  in.media = s.media;
  in.precision = s.precision;
  in.optimizer = parallel::name_of(s.optimizer);
  in.adamw_patterns = s.adamw_patterns;
  in.recompute = recompute_policy(cfg);
  in.micro_batch = s.micro_batch;
  in.seq_len = s.seq_len;
  in.seq_chunk = cfg.train.seq_chunk;
  in.grad_accum = plan.accumulation();
  in.threads = threads;
  in.layout = layout_of(plan, rank);
  in.reducer.bucket_bytes = s.reducer.bucket_bytes;
  in.reducer.compress = s.reducer.compress;
  in.reducer.preconditioned = s.reducer.preconditioned;
  in.muon_distribution = parallel::name_of(s.muon_distribution);
  in.matrix_grad = s.precision.matrix_grad();
  in.moment_dtype = s.moment_dtype;
  in.master_dtype = s.master_dtype;
  in.factored_second_moment = s.factored_second_moment;
  in.widened_bf16_gemm = kernels::cpu_widens_bf16_matmul();
  in.cp_all_to_all = cfg.parallel.cp_comm == "all_to_all";
  in.document_mask = cfg.data.document_mask;
  return in;
}

planner::MemoryInputs memory_inputs(const Config& cfg, const nn::Precision& prec, int64_t threads,
                                    const planner::Layout& layout) {
  const parallel::TrainingPlan plan =
      make_plan(cfg, prec, static_cast<int>(layout.dp * layout.cp * layout.tp * layout.pp));
  planner::MemoryInputs in = memory_inputs(cfg, plan, 0, threads);
  in.layout = layout;  // as given (e.g. ZeRO-1 asked for by `moetron memory --zero1`)
  return in;
}

std::string describe_precision(const planner::MemoryInputs& in) {
  std::string s(dtype_name(in.precision.compute));
  std::string modes;
  if (in.matrix_grad == DType::bf16) modes = "bf16 grads";
  if (in.moment_dtype == DType::bf16 || in.moment_dtype == DType::u8) {
    modes += std::string(modes.empty() ? "" : ", ") +
             (in.moment_dtype == DType::u8 ? "int8 moments" : "bf16 moments");
  }
  if (in.factored_second_moment) modes += ", factored v";
  if (in.master_dtype == DType::bf16)
    modes += std::string(modes.empty() ? "" : ", ") + "bf16 masters";
  return modes.empty() ? s : s + " (" + modes + ")";
}

planner::Layout layout_of(const parallel::TrainingPlan& plan, int rank) {
  const parallel::PlanSettings& s = plan.settings();
  const parallel::RankCoords at = plan.coords(rank);
  planner::Layout l;
  l.pp = s.pp;
  l.tp = s.tp;
  l.tp_rows = s.tp_rows;
  l.ep = s.ep;
  l.cp = s.cp;
  l.dp = plan.dp();
  l.zero1 = s.zero;
  l.sequence_parallel = s.sequence_parallel;
  l.vpp = s.vpp;
  l.schedule = parallel::name_of(s.schedule);
  l.stage = at.pp;
  l.stage_rank = at.stage_rank;
  l.stages = plan.stages();  // the split the job uses (measured costs may differ from FLOPs)
  if (s.pp == 1) l.stages.clear();
  return l;
}

planner::Layout layout_of(const Config& cfg, int64_t world_size, int64_t rank) {
  const nn::Precision prec = resolve_precision(cfg.train, nullptr);
  planner::Layout l =
      layout_of(make_plan(cfg, prec, static_cast<int>(world_size)), static_cast<int>(rank));
  l.stage_rank = 0;  // the stage's first rank (as predicted before the plan named ranks)
  return l;
}

std::string describe(const planner::Layout& l) {
  std::ostringstream os;
  os << "dp " << l.dp << (l.zero1 ? " (ZeRO-1)" : "");
  if (l.cp > 1) os << ", cp " << l.cp;
  if (l.tp_rows > 1) {
    os << ", tp " << l.tp_rows << " x " << l.tp / l.tp_rows << " (2-D)";
  } else if (l.tp > 1) {
    os << ", tp " << l.tp << (l.sequence_parallel ? " (sp)" : "");
  }
  if (l.ep > 1) os << ", ep " << l.ep;
  if (l.pp > 1)
    os << ", pp " << l.pp << (l.vpp > 1 ? " x vpp " + std::to_string(l.vpp) : "") << " "
       << l.schedule << (l.stage >= 0 ? " stage " + std::to_string(l.stage) : std::string());
  return os.str();
}

int64_t memory_budget_bytes(const Config& cfg) {
  // "auto": this rank's share of the machine, which its launcher's other local ranks share.
  if (cfg.train.memory_budget == "auto")
    return planner::available_memory_bytes() / comm::detect_launch_env().local_size;
  return planner::parse_bytes(cfg.train.memory_budget, "train.memory_budget");
}

namespace {

std::string budget_origin(const Config& cfg) {
  if (cfg.train.memory_budget != "auto") return " (train.memory_budget)";
  const int local = comm::detect_launch_env().local_size;
  return local > 1 ? " (available memory / " + std::to_string(local) + " ranks on this machine)"
                   : " (available memory)";
}

}  // namespace

std::string memory_table(const std::vector<MemoryRow>& rows) {
  std::ostringstream os;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-34s", "per rank");
  os << buf;
  for (int t = 0; t < kNumMemTags; ++t) {
    std::snprintf(buf, sizeof(buf), " %12s",
                  std::string(mem_tag_name(static_cast<MemTag>(t))).c_str());
    os << buf;
  }
  std::snprintf(buf, sizeof(buf), " %12s\n", "total peak");
  os << buf;
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof(buf), "%-34s", r.label.c_str());
    os << buf;
    for (int t = 0; t < kNumMemTags; ++t) {
      std::snprintf(buf, sizeof(buf), " %12s",
                    planner::format_bytes(r.estimate.peak[static_cast<size_t>(t)]).c_str());
      os << buf;
    }
    std::snprintf(buf, sizeof(buf), " %12s\n",
                  planner::format_bytes(r.estimate.total_peak).c_str());
    os << buf;
  }
  return os.str();
}

nlohmann::json memory_json(const std::vector<MemoryRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json bytes;
    for (int t = 0; t < kNumMemTags; ++t) {
      bytes[std::string(mem_tag_name(static_cast<MemTag>(t)))] =
          r.estimate.peak[static_cast<size_t>(t)];
    }
    bytes["total_peak"] = r.estimate.total_peak;
    out.push_back({{"label", r.label}, {"parameters", r.estimate.param_count}, {"bytes", bytes}});
  }
  return out;
}

std::string memory_plan(const Config& cfg, const parallel::TrainingPlan& plan, int rank,
                        int64_t threads) {
  const planner::MemoryInputs in = memory_inputs(cfg, plan, rank, threads);
  const planner::Layout& layout = in.layout;
  const planner::MemoryEstimate est = planner::estimate_memory(in);
  const int64_t budget = memory_budget_bytes(cfg);
  const int64_t fits = planner::largest_fitting_micro_batch(in, budget);
  std::ostringstream os;
  os << "memory (rank " << rank << ", predicted): " << describe_precision(in) << ", recompute "
     << nn::describe(in.recompute) << ", micro-batch " << in.micro_batch << " x " << in.seq_len
     << " tokens, " << describe(layout) << (layout.ep > 1 ? " (balanced routing assumed)" : "")
     << "\n";
  os << memory_table({{"predicted peak", est}});
  os << "memory budget " << planner::format_bytes(budget) << budget_origin(cfg)
     << ": largest micro-batch that fits " << fits << "\n";
  if (est.total_peak > budget) {
    os << "warning: the predicted peak " << planner::format_bytes(est.total_peak)
       << " exceeds the budget; lower "
       << "train.micro_batch to " << fits << " or set recompute.policy\n";
  }
  return os.str();
}

planner::MemoryEstimate measured_peaks(const MemStats& stats) {
  planner::MemoryEstimate e;
  e.peak = stats.peak;
  e.total_peak = stats.total_peak;
  return e;
}

}  // namespace moetron::train
