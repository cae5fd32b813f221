// moetron simulate's timeline: its end is the cost model's step time, stage
// 0's idle time is the predicted bubble, every stage runs each micro-batch's
// forward and backward once per chunk, ops never overlap and their parts
// stay inside them, and the Chrome trace carries every slice.
#include "moetron/planner/step_timeline.h"

#include <gtest/gtest.h>

#include <map>

#include "util/preset_model.h"

namespace moetron::planner {
namespace {

CostModel mixtral(int64_t devices_per_node) {
  return test::preset_model("mixtral-8x7b", "h100", devices_per_node, 64);
}

TEST(StepTimeline, EndsAtThePredictedStepWithTheBubbleItPredicts) {
  const CostModel model = mixtral(8);
  for (const char* text : {"dp=8,tp=8", "tp=2,pp=4,dp=8,ep=8", "tp=2,pp=4,vpp=2,dp=4,cp=2,ep=8",
                           "tp=2,pp=8,vpp=4,dp=4,mb=2,recompute=full,zero1"}) {
    const LayoutChoice l = parse_layout(text, 64);
    const StepTimeline t = simulate_step(model, l);
    EXPECT_NEAR(t.end_s, t.cost.step_s, 1e-9 * t.cost.step_s) << text;
    EXPECT_NEAR(t.total("bubble"), t.cost.bubble_s, 1e-9 * t.cost.step_s) << text;
    EXPECT_NEAR(t.total("compute"), t.cost.compute_s, 1e-9 * t.cost.step_s) << text;
    EXPECT_NEAR(t.total("tp"), t.cost.tp_comm_s, 1e-9 * t.cost.step_s) << text;
    // Each stage: a forward and a backward per micro-batch and chunk.
    std::map<int64_t, int64_t> ops;
    for (const TimelineSlice& s : t.slices) ops[s.stage] += s.category == "op";
    ASSERT_EQ(static_cast<int64_t>(ops.size()), l.pp) << text;
    for (const auto& [stage, n] : ops) EXPECT_EQ(n, 2 * t.microbatches * l.vpp) << text;
  }
}

TEST(StepTimeline, OpsDoNotOverlapAndTheirPartsStayInside) {
  const StepTimeline t = simulate_step(mixtral(8), parse_layout("tp=2,pp=4,vpp=2,dp=8,ep=8", 64));
  std::map<int64_t, double> free_from;  // per stage, when its last depth-0 slice ended
  std::map<int64_t, const TimelineSlice*> parent;
  for (const TimelineSlice& s : t.slices) {
    EXPECT_GE(s.duration, 0) << s.name;
    if (s.track != 0) continue;
    if (s.depth == 0) {
      EXPECT_GE(s.start, free_from[s.stage] - 1e-12) << s.name << " overlaps on stage " << s.stage;
      free_from[s.stage] = s.start + s.duration;
      parent[s.stage] = &s;
    } else {
      const TimelineSlice* p = parent[s.stage];
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p->category, "op");
      EXPECT_GE(s.start, p->start - 1e-12) << s.name;
      EXPECT_LE(s.start + s.duration, p->start + p->duration + 1e-12) << s.name;
    }
  }
}

TEST(StepTimeline, TheChromeTraceCarriesEverySliceInMicroseconds) {
  const StepTimeline t = simulate_step(mixtral(8), parse_layout("tp=2,pp=2,dp=16,ep=8", 64));
  const nlohmann::json j = chrome_trace(t, "test");
  int64_t complete = 0, names = 0;
  double end_us = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "X") {
      ++complete;
      end_us = std::max(end_us, e.at("ts").get<double>() + e.at("dur").get<double>());
    } else if (e.at("name") == "process_name") {
      ++names;
    }
  }
  EXPECT_EQ(complete, static_cast<int64_t>(t.slices.size()));
  EXPECT_EQ(names, 2);
  EXPECT_NEAR(end_us, t.cost.step_s * 1e6, 1e-3);
  EXPECT_DOUBLE_EQ(j.at("otherData").at("predicted_step_s").get<double>(), t.cost.step_s);
}

}  // namespace
}  // namespace moetron::planner
