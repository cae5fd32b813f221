#include "moetron/planner/step_timeline.h"

#include <algorithm>

#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::planner {

namespace {

struct Part {
  const char* name;
  const char* category;
  double seconds;  // per step, over all ops
};

// The parts an op is split into, in the order they run within it.
std::vector<Part> op_parts(const StepCost& c) {
  return {{"compute", "compute", c.compute_s},
          {"elementwise", "compute", c.elementwise_s},
          {"tp", "comm", c.tp_comm_s},
          {"ep all-to-all", "comm", c.ep_comm_s},
          {"cp ring (exposed)", "comm", c.cp_comm_s},
          {"pp send", "comm", c.pp_comm_s}};
}

std::string op_name(const parallel::PipeOp& op) {
  std::string s = op.forward ? "F mb" : "B mb";
  s += std::to_string(op.mb);
  s += " c";
  s += std::to_string(op.chunk);
  return s;
}

// One op and its parts, each part's share of the op's time.
void add_op(StepTimeline& t, int64_t stage, const parallel::TimedOp& op,
            const std::vector<Part>& parts, double pipelined) {
  t.slices.push_back({stage, 0, op_name(op.op), "op", 0, op.start, op.end - op.start});
  double at = op.start;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].seconds <= 0) continue;
    // The last part ends exactly with its op, whatever the rounding.
    const bool last = i + 1 == parts.size();
    const double d = last ? op.end - at : (op.end - op.start) * parts[i].seconds / pipelined;
    t.slices.push_back({stage, 0, parts[i].name, parts[i].category, 1, at, d});
    at += d;
  }
}

}  // namespace

double StepTimeline::total(const std::string& name, int64_t stage) const {
  double s = 0;
  for (const TimelineSlice& x : slices) {
    if (x.stage == stage && x.name == name) s += x.duration;
  }
  return s;
}

StepTimeline simulate_step(const CostModel& model, const LayoutChoice& l) {
  StepTimeline t;
  t.layout = l;
  t.cost = model.predict(l);
  const StepCost& c = t.cost;
  t.microbatches = model.workload().global_batch / (l.dp * l.micro_batch);
  const double m = static_cast<double>(t.microbatches);
  const double pipelined = pipelined_seconds(c);
  const auto stages = parallel::simulate_schedule_timeline(
      parallel::ScheduleKind::one_f_one_b, l.pp, t.microbatches, l.vpp, pipelined / m / 3,
      2 * pipelined / m / 3);
  const std::vector<Part> parts = op_parts(c);
  // What the cost model hides of the dp reduction under the pipeline's end.
  const double hidden = c.dp_reduce_s - c.dp_comm_s;
  for (int64_t s = 0; s < l.pp; ++s) {
    double idle_from = 0;
    for (const parallel::TimedOp& op : stages[static_cast<size_t>(s)]) {
      if (op.start > idle_from) {
        t.slices.push_back({s, 0, "bubble", "bubble", 0, idle_from, op.start - idle_from});
      }
      add_op(t, s, op, parts, pipelined);
      idle_from = op.end;
    }
    const double end = idle_from;
    double ready = end;
    if (c.dp_reduce_s > 0) {
      const double from = std::max(0.0, end - hidden);
      t.slices.push_back({s, 1, "dp reduction", "comm", 0, from, c.dp_reduce_s});
      ready = std::max(ready, from + c.dp_reduce_s);
    }
    t.slices.push_back({s, 0, "optimizer", "optimizer", 0, ready, c.optimizer_s});
    t.end_s = std::max(t.end_s, ready + c.optimizer_s);
  }
  return t;
}

nlohmann::json chrome_trace(const StepTimeline& t, const std::string& title) {
  nlohmann::json events = nlohmann::json::array();
  for (int64_t s = 0; s < t.layout.pp; ++s) {
    const int64_t ranks = t.layout.dp * t.layout.tp * t.layout.cp;
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", s},
                      {"args",
                       {{"name", "stage " + std::to_string(s) + " (" + std::to_string(ranks) +
                                     " ranks: dp x tp x cp)"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", s},
                      {"tid", 0},
                      {"args", {{"name", "forward / backward"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", s},
                      {"tid", 1},
                      {"args", {{"name", "dp gradients"}}}});
  }
  for (const TimelineSlice& x : t.slices) {
    events.push_back({{"name", x.name},
                      {"cat", x.category},
                      {"ph", "X"},
                      {"pid", x.stage},
                      {"tid", x.track},
                      {"ts", x.start * 1e6},
                      {"dur", x.duration * 1e6}});
  }
  const StepCost& c = t.cost;
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"title", title},
            {"layout", t.layout.str()},
            {"microbatches", t.microbatches},
            {"predicted_step_s", c.step_s},
            {"timeline_end_s", t.end_s},
            {"tokens_per_s", c.tokens_per_s},
            {"mfu", c.mfu},
            {"compute_s", c.compute_s},
            {"bubble_s", c.bubble_s},
            {"dp_exposed_s", c.dp_comm_s},
            {"optimizer_s", c.optimizer_s}}}};
}

}  // namespace moetron::planner
