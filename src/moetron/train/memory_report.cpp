#include "moetron/train/memory_report.h"

#include <cstdio>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/optim/optimizer.h"

namespace moetron::train {

planner::MemoryInputs memory_inputs(const Config& cfg, const nn::Precision& prec, int64_t threads,
                                    const planner::Layout& layout) {
  planner::MemoryInputs in;
  in.model = cfg.model;
  in.moe = cfg.moe;
  in.precision = prec;
  in.optimizer = cfg.optim.name;
  in.adamw_patterns = optim::split_patterns(cfg.optim.adamw_params);
  in.recompute = recompute_policy(cfg);
  in.micro_batch = cfg.train.micro_batch;
  in.seq_len = cfg.train.seq_len;
  in.grad_accum = cfg.train.grad_accum;
  in.threads = threads;
  in.layout = layout;
  return in;
}

int64_t memory_budget_bytes(const Config& cfg) {
  if (cfg.train.memory_budget == "auto") return planner::available_memory_bytes();
  return planner::parse_bytes(cfg.train.memory_budget, "train.memory_budget");
}

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

std::string memory_plan(const Config& cfg, const nn::Precision& prec, int64_t threads, int rank,
                        const planner::Layout& layout) {
  planner::MemoryInputs in = memory_inputs(cfg, prec, threads, layout);
  in.grad_accum = accumulation_steps(cfg, layout.dp);
  const planner::MemoryEstimate est = planner::estimate_memory(in);
  const int64_t budget = memory_budget_bytes(cfg);
  const int64_t fits = planner::largest_fitting_micro_batch(in, budget);
  std::ostringstream os;
  os << "memory (rank " << rank << ", predicted): " << dtype_name(prec.compute) << ", recompute "
     << nn::describe(in.recompute) << ", micro-batch " << in.micro_batch << " x " << in.seq_len
     << " tokens\n";
  os << memory_table({{"predicted peak", est}});
  os << "memory budget " << planner::format_bytes(budget)
     << (cfg.train.memory_budget == "auto" ? " (available memory)" : " (train.memory_budget)")
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
