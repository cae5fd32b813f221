// parallel.auto: the planner's choice for a world size is the fastest
// plan of its search that the trainer accepts, written into the config's
// keys; without a global batch, or with an unknown profile, it is an error
// naming the key; off, the config is left alone.
#include "moetron/train/auto_layout.h"

#include <gtest/gtest.h>

#include "moetron/planner/cost_model.h"
#include "moetron/train/plan_config.h"

namespace moetron::train {
namespace {

const std::string kConfigs = MOETRON_SOURCE_DIR "/configs";

Config tiny_auto(const std::vector<std::string>& more = {}) {
  std::vector<std::string> sets = {
      "parallel.auto=true", "train.global_batch=8",
      "parallel.auto_device=" + kConfigs + "/hardware/this-machine.toml"};
  sets.insert(sets.end(), more.begin(), more.end());
  return load_config(kConfigs + "/tiny.toml", sets);
}

TEST(AutoLayout, ChoosesTheFastestPlanTheTrainerAccepts) {
  for (const int world : {1, 2, 4}) {
    const Config cfg = tiny_auto();
    const AutoLayout a = choose_auto_layout(cfg, world);
    const planner::LayoutChoice& l = a.chosen.layout;
    EXPECT_EQ(l.world(), world);
    // Written into the keys the trainer reads, and the trainer takes it.
    EXPECT_EQ(a.config.parallel.tp, l.tp);
    EXPECT_EQ(a.config.parallel.pp, l.pp);
    EXPECT_EQ(a.config.parallel.cp, l.cp);
    EXPECT_EQ(a.config.parallel.ep, l.ep);
    EXPECT_EQ(a.config.parallel.zero, l.zero1);
    EXPECT_EQ(a.config.train.micro_batch, l.micro_batch);
    EXPECT_EQ(a.config.recompute.policy, l.recompute);
    // A grid is written as parallel.tp_2d (q x q) and resolved.
    EXPECT_EQ(a.config.parallel.tp_2d.empty(), !l.tp_2d);
    EXPECT_EQ(a.config.parallel.tp_rows, l.tp_2d ? planner::grid_side(l.tp) : 1);
    EXPECT_NO_THROW(validate(a.config));
    const parallel::TrainingPlan plan =
        make_plan(a.config, resolve_precision(a.config.train, nullptr), world);
    EXPECT_EQ(plan.dp(), l.dp);
    // Nothing the trainer would accept is predicted faster.
    planner::HardwareProfile hw =
        planner::load_hardware_profile(kConfigs + "/hardware/this-machine.toml");
    hw.devices_per_node = world;
    const planner::CostModel model(planner_workload(cfg), hw);
    const planner::SearchSpace space = planner::trainer_space();
    const planner::SearchResult r = planner::search_layouts(model, world, 1, space);
    ASSERT_FALSE(r.plans.empty());
    EXPECT_GE(a.chosen.cost.step_s, r.plans.front().cost.step_s);
    if (a.considered == 1) {
      EXPECT_EQ(a.chosen.layout.str(), r.plans.front().layout.str());
    }
    EXPECT_NE(a.summary().find(l.str()), std::string::npos) << a.summary();
  }
}

TEST(AutoLayout, ARuleOfTheTrainerSkipsThePlansItRefuses) {
  // train.seq_chunk needs pp = 1: whatever the planner prefers, the chosen
  // layout keeps one stage.
  const AutoLayout a = choose_auto_layout(tiny_auto({"train.seq_chunk=8"}), 4);
  EXPECT_EQ(a.chosen.layout.pp, 1);
  EXPECT_EQ(a.config.parallel.pp, 1);
  EXPECT_GT(a.considered, 1);  // the planner's favourite here is pp = 4
  EXPECT_NE(a.summary().find("the trainer refused"), std::string::npos) << a.summary();
}

TEST(AutoLayout, ErrorsNameTheKey) {
  try {
    load_config(kConfigs + "/tiny.toml", {"parallel.auto=true"});
    ADD_FAILURE() << "no global batch accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.auto"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.global_batch"), std::string::npos) << e.what();
  }
  try {
    choose_auto_layout(tiny_auto({"parallel.auto_device=no-such-device"}), 2);
    ADD_FAILURE() << "an unknown profile accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.auto_device 'no-such-device'"),
              std::string::npos)
        << e.what();
  }
}

TEST(AutoLayout, OffLeavesTheConfigAlone) {
  const Config cfg = load_config(kConfigs + "/tiny.toml", {"parallel.tp=2"});
  std::string log;
  const Config same = resolve_auto_layout(cfg, 2, &log);
  EXPECT_EQ(to_toml(same), to_toml(cfg));
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace moetron::train
