// Monitoring under mpirun (2 and 4 ranks): the per-layer statistics of a
// parallel layout (gradient, parameter and update norms per matrix group,
// activation RMS per block) equal the one-rank run's, each element counted
// once whatever holds it, and `moetron report` draws each layout's run; every
// rank's times reach rank 0; and a rank made slow is named a straggler in the
// metrics and in events.jsonl.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "moetron/monitor/json_series.h"
#include "moetron/monitor/run_report.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

comm::Communicator& world() {
  return test::mpi_world();
}
const std::string& job_dir() {
  return test::layout_job_dir("moetron_monitor_");
}

constexpr int64_t kRows = 4;  // per micro-batch over the dp ranks
constexpr int64_t kMicrobatches = 2;
const std::vector<std::string> kMonitor = {"train.steps=3", "monitor.layer_stats_every=1",
                                           "monitor.update_stats=true"};

struct Layout {
  std::string name;
  int64_t dp;
  std::vector<std::string> sets;
};

std::vector<Layout> layouts() {
  if (world().size() == 2) {
    return {{"ep2", 2, {"parallel.ep=2"}},
            {"tp2-sp", 1, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
            {"pp2", 1, {"parallel.pp=2"}}};
  }
  return {{"tp2-dp2-ep2", 2, {"parallel.tp=2", "parallel.ep=2"}},
          {"pp2-dp2-ep2", 2, {"parallel.pp=2", "parallel.ep=2"}}};
}

// The registry's per-layer series after the run: key -> value.
std::map<std::string, double> layer_series(Trainer& t) {
  std::map<std::string, double> out;
  const nlohmann::json series = monitor::json_series(t.monitor().registry().snapshot());
  for (const auto& [key, v] : series.items()) {
    const bool per_layer =
        key.rfind("moetron_param_", 0) == 0 || key.rfind("moetron_activation_rms", 0) == 0;
    if (per_layer && v.is_number()) out[key] = v.get<double>();
  }
  return out;
}

// `moetron report` of a parallel layout's run: every rank on the per-rank
// panel, communication per plan axis, and a pipeline's stages.
void expect_layout_report(const std::string& run, const Layout& l) {
  monitor::ReportOptions o;
  o.run_dir = run;
  const monitor::ReportResult r = monitor::write_run_report(o);
  EXPECT_EQ(r.summary.steps, 3) << l.name;
  std::ifstream in(r.html_path);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> panels = {"loss",           "grad_norm_per_layer", "step_time",
                                     "rank_step_time", "comm_bytes",          "memory"};
  if (l.name.rfind("pp", 0) == 0) panels.push_back("stage_busy");
  for (const std::string& id : panels) {
    EXPECT_NE(html.find("id=\"panel-" + id + "\""), std::string::npos) << l.name << ": " << id;
    EXPECT_TRUE(std::filesystem::exists(r.svg_dir + "/" + id + ".svg")) << l.name << ": " << id;
  }
  // One line per rank on the per-rank chart: its legend names each.
  std::ifstream svg(r.svg_dir + "/rank_step_time.svg");
  const std::string ranks((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  for (int rank = 0; rank < world().size(); ++rank) {
    EXPECT_NE(ranks.find("rank " + std::to_string(rank)), std::string::npos)
        << l.name << " " << rank;
  }
}

TEST(MonitoringLayouts, LayerStatisticsEqualOneRank) {
  // Collective set-up first, in the same order on every rank.
  const std::string& job = job_dir();
  const std::shared_ptr<comm::Communicator> shared = test::shared_world();
  std::map<std::string, double> want;
  if (world().rank() == 0) {
    Trainer one(test::layout_config(job, kRows, kMicrobatches, kMonitor),
                job + "/runs/one-rank-" + std::to_string(::getpid()), false);
    one.run();
    want = layer_series(one);
  }
  for (const Layout& l : layouts()) {
    const std::string run = test::layout_run_dir(job, l.name);
    Trainer t(test::layout_config(job, kRows / l.dp, kMicrobatches, test::with(kMonitor, l.sets)),
              run, false, shared);
    t.run();
    if (world().rank() != 0) continue;
    const std::map<std::string, double> got = layer_series(t);
    ASSERT_EQ(got.size(), want.size()) << l.name;
    ASSERT_GT(got.size(), 100u) << l.name;
    for (const auto& [key, v] : want) {
      ASSERT_TRUE(got.count(key)) << l.name << ": no " << key;
      // Float reassociation over the ranks' partial sums and the layout's
      // reductions (measured below 1e-5 on these layouts).
      EXPECT_LT(test::rel_diff(got.at(key), v), 1e-4) << l.name << " " << key;
    }
    expect_layout_report(run, l);
  }
}

TEST(MonitoringLayouts, EveryRankReportsAndASlowRankIsNamed) {
  const std::string& job = job_dir();
  const std::shared_ptr<comm::Communicator> shared = test::shared_world();
  const std::string dir = test::layout_run_dir(job, "straggler");
  const int slow = world().size() - 1;
  Trainer t(test::layout_config(job, kRows / world().size(), 1,
                                {"train.steps=8", "monitor.layer_stats_every=0",
                                 "monitor.straggler_intervals=2", "monitor.straggler_margin=1"}),
            dir, false, shared);
  // Busy time, not waiting: the slow rank sleeps before its update while
  // the others wait for it, blocked in their next collective.
  if (world().rank() == slow) {
    t.before_update = [](int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  }
  t.run();
  if (world().rank() != 0) return;
  const monitor::Registry& r = t.monitor().registry();
  for (int rank = 0; rank < world().size(); ++rank) {
    EXPECT_GT(r.find("moetron_rank_step_seconds")->value({std::to_string(rank)}), 0) << rank;
  }
  // The slowed rank is named and still is at the end. (Another rank may
  // also cross the margin for a moment on a loaded machine: not asserted.)
  EXPECT_EQ(r.find("moetron_straggler")->value({std::to_string(slow)}), 1.0);
  EXPECT_GE(r.find("moetron_stragglers_total")->value(), 1.0);
  std::ifstream events(dir + "/events.jsonl");
  std::string line;
  int named = 0;
  while (std::getline(events, line)) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.at("kind") == "straggler" && e.at("rank").get<int>() == slow) {
      EXPECT_GT(e.at("ratio").get<double>(), 2.0);
      ++named;
    }
  }
  EXPECT_EQ(named, 1);
}

}  // namespace
}  // namespace moetron::train
