#include "moetron/train/plan_report.h"

#include <cstdio>
#include <set>
#include <sstream>

#include "moetron/train/memory_report.h"

namespace moetron::train {

namespace {

using nlohmann::json;
using parallel::Group;

constexpr Group kGroups[] = {Group::tp,    Group::cp, Group::dp,       Group::pp,
                             Group::stage, Group::ep, Group::expert_dp};

json layer_ranges(const std::vector<parallel::LayerRange>& ranges) {
  json out = json::array();
  for (const auto& [a, b] : ranges) out.push_back({a, b});
  return out;
}

json settings_json(const parallel::TrainingPlan& plan) {
  const parallel::PlanSettings& s = plan.settings();
  return {{"world_size", plan.world_size()},
          {"dp", plan.dp()},
          {"tp", s.tp},
          {"tp_rows", s.tp_rows},
          {"cp", s.cp},
          {"pp", s.pp},
          {"ep", s.ep},
          {"cp", s.cp},
          {"vpp", s.vpp},
          {"sequence_parallel", s.sequence_parallel},
          {"zero1", s.zero},
          {"schedule", parallel::name_of(s.schedule)},
          {"stage_balance", parallel::name_of(s.stage_balance)},
          {"micro_batch", s.micro_batch},
          {"seq_len", s.seq_len},
          {"microbatches_per_step", plan.accumulation()},
          {"precision", std::string(dtype_name(s.precision.compute))},
          {"optimizer", parallel::name_of(s.optimizer)},
          {"muon_distribution", parallel::name_of(s.muon_distribution)},
          {"bucket_bytes", s.reducer.bucket_bytes}};
}

// Each axis's groups, each once (by its lowest rank).
json groups_json(const parallel::TrainingPlan& plan) {
  json out = json::object();
  for (Group g : kGroups) {
    if (!plan.has_group(g)) continue;
    std::set<std::vector<int>> seen;
    json list = json::array();
    for (int r = 0; r < plan.world_size(); ++r) {
      std::vector<int> members = plan.group(g, r);
      if (seen.insert(members).second) list.push_back(members);
    }
    out[parallel::name_of(g)] = list;
  }
  return out;
}

json reducers_json(const parallel::RankPlan& rp) {
  json out = json::array();
  for (const parallel::ReducerPlan& r : rp.reducers) {
    json buckets = json::array();
    for (const parallel::PlannedBucket& b : r.buckets) {
      json names = json::array();
      for (const parallel::PlannedSlot& s : b.slots)
        names.push_back(rp.inventory.params[s.param].name);
      buckets.push_back(
          {{"elements", b.numel}, {"chunk_elements", b.numel / r.size}, {"parameters", names}});
    }
    const bool rs = r.options.mode == parallel::ReduceMode::reduce_scatter;
    out.push_back({{"carries", parallel::name_of(r.carries)},
                   {"group", parallel::name_of(r.over)},
                   {"size", r.size},
                   {"mode", rs ? "reduce_scatter" : "allreduce"},
                   {"buckets", buckets}});
  }
  return out;
}

json memory_bytes(const planner::MemoryEstimate& e) {
  json bytes = json::object();
  for (int t = 0; t < kNumMemTags; ++t)
    bytes[std::string(mem_tag_name(static_cast<MemTag>(t)))] = e.peak[static_cast<size_t>(t)];
  bytes["total_peak"] = e.total_peak;
  return bytes;
}

json rank_json(const Config& cfg, const parallel::TrainingPlan& plan, int rank,
               const PlanReportOptions& o) {
  const parallel::RankPlan rp = plan.rank_plan(rank);
  const parallel::RankCoords& c = rp.coords;
  int64_t params = 0;
  for (const auto& p : rp.inventory.params) params += p.numel();
  json j = {
      {"rank", rank},
      {"coords",
       {{"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}, {"tp", c.tp}, {"ep", c.ep}, {"edp", c.edp}}},
      {"layers", layer_ranges(plan.chunks(c.pp))},
      {"embedding", rp.place.embedding},
      {"head", rp.place.head},
      {"parameters", params},
      {"reducers", reducers_json(rp)}};
  if (o.memory)
    j["memory"] = memory_bytes(planner::estimate_memory(memory_inputs(cfg, plan, rank, o.threads)));
  return j;
}

std::string join_ranges(const json& ranges) {
  std::ostringstream os;
  for (size_t i = 0; i < ranges.size(); ++i) {
    os << (i ? " " : "") << "[" << ranges[i][0].get<int64_t>() << ", "
       << ranges[i][1].get<int64_t>() << ")";
  }
  return os.str();
}

std::string reducers_cell(const json& reducers) {
  std::ostringstream os;
  for (size_t i = 0; i < reducers.size(); ++i) {
    const json& r = reducers[i];
    int64_t chunk = 0;
    for (const auto& b : r["buckets"]) chunk += b["chunk_elements"].get<int64_t>();
    os << (i ? "; " : "") << r["carries"].get<std::string>() << " over "
       << r["group"].get<std::string>() << r["size"].get<int>() << ": " << r["buckets"].size()
       << " buckets";
    if (r["mode"] == "reduce_scatter") os << ", ZeRO chunk " << chunk;
  }
  return reducers.empty() ? "-" : os.str();
}

}  // namespace

json plan_json(const Config& cfg, const parallel::TrainingPlan& plan, const PlanReportOptions& o) {
  json stages = json::array();
  for (int64_t p = 0; p < plan.settings().pp; ++p) stages.push_back(layer_ranges(plan.chunks(p)));
  json ranks = json::array();
  for (int r = 0; r < plan.world_size(); ++r) ranks.push_back(rank_json(cfg, plan, r, o));
  return {{"layout", settings_json(plan)}, {"recompute", nn::describe(recompute_policy(cfg))},
          {"threads", o.threads},          {"stages", stages},
          {"groups", groups_json(plan)},   {"ranks", ranks}};
}

std::string plan_table(const json& plan, const PlanReportOptions& o) {
  std::ostringstream os;
  const json& l = plan["layout"];
  // A 2-D grid: its rows are consecutive tp ranks (nn/tensor_parallel_2d.h).
  const int64_t rows = l.value("tp_rows", int64_t{1}), tp = l["tp"].get<int64_t>();
  const std::string grid = rows > 1 ? " (2-D grid " + std::to_string(rows) + " x " +
                                          std::to_string(tp / rows) + ": rows of " +
                                          std::to_string(tp / rows) + " consecutive tp ranks)"
                                    : "";
  os << "plan: " << l["world_size"] << " ranks = pp " << l["pp"] << " x dp " << l["dp"] << " x tp "
     << l["tp"]
     << (rows > 1                             ? grid
         : l["sequence_parallel"].get<bool>() ? " (sp)"
                                              : "")
     << "; ep " << l["ep"] << " folded into each stage's dp x tp ranks"
     << (l["zero1"].get<bool>() ? "; ZeRO-1" : "") << "; " << l["microbatches_per_step"]
     << " micro-batches of " << l["micro_batch"] << " x " << l["seq_len"] << " tokens per dp rank; "
     << l["precision"].get<std::string>() << ", " << l["optimizer"].get<std::string>()
     << ", recompute " << plan["recompute"].get<std::string>() << "\n";
  for (size_t p = 0; p < plan["stages"].size(); ++p) {
    os << "stage " << p << ": layers " << join_ranges(plan["stages"][p]) << "\n";
  }
  for (const auto& [axis, groups] : plan["groups"].items()) {
    os << "groups " << axis << ":";
    for (const auto& g : groups) {
      os << " [";
      for (size_t i = 0; i < g.size(); ++i) os << (i ? " " : "") << g[i].get<int>();
      os << "]";
    }
    os << "\n";
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%5s %3s %3s %3s %3s %4s  %-16s %12s %14s  %s\n", "rank", "pp",
                "dp", "tp", "ep", "edp", "layers", "parameters", "predicted peak", "reducers");
  os << buf;
  int64_t shown = 0;
  for (const auto& r : plan["ranks"]) {
    if (shown++ == o.max_table_ranks) {
      os << "... (" << plan["ranks"].size() - static_cast<size_t>(o.max_table_ranks)
         << " more ranks in the JSON)\n";
      break;
    }
    const json& c = r["coords"];
    const std::string peak = r.contains("memory")
                                 ? planner::format_bytes(r["memory"]["total_peak"].get<int64_t>())
                                 : "-";
    std::snprintf(buf, sizeof(buf), "%5d %3d %3d %3d %3d %4d  %-16s %12lld %14s  %s\n",
                  r["rank"].get<int>(), c["pp"].get<int>(), c["dp"].get<int>(), c["tp"].get<int>(),
                  c["ep"].get<int>(), c["edp"].get<int>(), join_ranges(r["layers"]).c_str(),
                  static_cast<long long>(r["parameters"].get<int64_t>()), peak.c_str(),
                  reducers_cell(r["reducers"]).c_str());
    os << buf;
  }
  return os.str();
}

}  // namespace moetron::train
