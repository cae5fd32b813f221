// Reading metrics.jsonl and events.jsonl back: runs before the monitor (top-
// level keys only), the monitor's "series", a running run's partial last
// line, bad lines named by file and line, resumed runs, derived events.
#include "moetron/monitor/run_history.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"

namespace moetron::monitor {
namespace {

namespace fs = std::filesystem;

RunHistory parse(const std::string& text) {
  RunHistory h;
  std::istringstream in(text);
  read_metrics(in, "metrics.jsonl", h);
  return h;
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kOldLines =
    R"({"step":1,"loss":5.5,"lr":0.001,"grad_norm":2.0,"tokens_per_s":1000,"mfu":0.1,"aux_loss":0.01,"z_loss":0.001,"skipped":false,"tokens":64,"dropped_slots":0,"step_s":0.5,"grad_bytes_sent":100,"expert_load":[[3,1],[2,2]]})"
    "\n"
    R"({"step":2,"loss":5.0,"lr":0.002,"grad_norm":null,"tokens_per_s":1100,"mfu":0.11,"aux_loss":0.01,"z_loss":0.001,"skipped":true,"tokens":64,"dropped_slots":0,"step_s":0.4,"grad_bytes_sent":50,"val_loss":5.2,"expert_load":[[1,1],[0,4]]})"
    "\n";

TEST(RunHistory, TopLevelKeysOfOldRunsBecomeTheMonitorsSeries) {
  const RunHistory h = parse(kOldLines);
  EXPECT_EQ(h.lines, 2);
  ASSERT_EQ(h.steps.size(), 2u);
  const Series* loss = h.find("moetron_loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->values, (std::vector<double>{5.5, 5.0}));
  EXPECT_EQ(loss->steps, (std::vector<double>{1, 2}));
  ASSERT_NE(h.find("moetron_validation_loss"), nullptr);
  EXPECT_EQ(h.find("moetron_validation_loss")->steps, (std::vector<double>{2}));
  EXPECT_TRUE(std::isnan(h.find("moetron_grad_norm")->values[1]));  // null: a NaN norm
  EXPECT_EQ(h.find("moetron_step_skipped")->values, (std::vector<double>{0, 1}));
  EXPECT_DOUBLE_EQ(h.find("moetron_mfu_ratio")->last(), 0.11);
  // Expert counts become shares of the layer's tokens.
  const Series* e = h.find(R"(moetron_expert_load_ratio{expert="0",layer="moe0"})");
  ASSERT_NE(e, nullptr);
  EXPECT_DOUBLE_EQ(e->values[0], 0.75);
  EXPECT_DOUBLE_EQ(e->values[1], 0.5);
  EXPECT_EQ(h.named("moetron_expert_load_ratio").size(), 4u);
  // Bytes per step are kept as the counter the monitor exports.
  EXPECT_EQ(h.find(R"(moetron_comm_bytes_total{axis="dp",op="gradients"})")->values,
            (std::vector<double>{100, 150}));
}

TEST(RunHistory, SeriesObjectIsReadAndWinsOverTheTopLevelKey) {
  const RunHistory h = parse(
      R"({"step":3,"time":1700000000.5,"loss":9.0,"lr":0.1,"expert_load":[[1,1]],"series":{"moetron_loss":3.25,)"
      R"("moetron_phase_seconds{phase=\"forward\"}":0.12,"moetron_expert_load_ratio{layer=\"3\",expert=\"5\"}":0.14,)"
      R"("moetron_step_seconds_sum":1.5,"moetron_step_seconds_count":3}})"
      "\n");
  EXPECT_EQ(h.find("moetron_loss")->values, (std::vector<double>{3.25}));
  EXPECT_EQ(h.find("moetron_learning_rate")->values, (std::vector<double>{0.1}));  // not in series
  EXPECT_DOUBLE_EQ(h.find(R"(moetron_phase_seconds{phase="forward"})")->last(), 0.12);
  const auto loads = h.named("moetron_expert_load_ratio");
  ASSERT_EQ(loads.size(), 1u);  // the top-level expert_load is not read beside the series
  EXPECT_EQ(loads[0].first.label("layer"), "3");
  EXPECT_EQ(loads[0].first.label("expert"), "5");
  EXPECT_DOUBLE_EQ(h.times[0], 1700000000.5);
  EXPECT_NE(h.find("moetron_step_seconds_sum"), nullptr);
  EXPECT_EQ(h.named("moetron_step_seconds").size(), 0u);  // _sum is another name
}

TEST(RunHistory, SeriesKeysRoundTrip) {
  const SeriesKey k = parse_series_key(R"(moetron_x{b="2",a="q\"uote"})");
  EXPECT_EQ(k.name, "moetron_x");
  EXPECT_EQ(k.label("a"), "q\"uote");
  EXPECT_EQ(series_key(k.name, k.labels), R"(moetron_x{a="q\"uote",b="2"})");
  EXPECT_THROW(parse_series_key(R"(moetron_x{a=1})"), Error);
  EXPECT_THROW(parse_series_key(R"({a="1"})"), Error);
}

TEST(RunHistory, PartialLastLineOfARunningRunIsSkipped) {
  const RunHistory h = parse(std::string(kOldLines) + R"({"step":3,"loss":4.)");
  EXPECT_EQ(h.steps.size(), 2u);
  EXPECT_TRUE(h.truncated_tail);
  // A complete last line without its newline yet is read.
  const RunHistory full = parse(std::string(kOldLines) + R"({"step":3,"loss":4.5})");
  EXPECT_EQ(full.steps.size(), 3u);
  EXPECT_FALSE(full.truncated_tail);
}

TEST(RunHistory, MalformedLineInTheMiddleNamesFileAndLine) {
  const std::string e = error_of(std::string(kOldLines) + "{\"step\":3,\"loss\":\n" + kOldLines);
  EXPECT_NE(e.find("metrics.jsonl:3"), std::string::npos) << e;
  EXPECT_NE(error_of("{\"loss\":1}\n").find("metrics.jsonl:1"), std::string::npos);
  EXPECT_NE(error_of("\n[1,2]\n").find("metrics.jsonl:2"), std::string::npos);
  EXPECT_NE(error_of(R"({"step":1,"series":{"a{b=1}":1}})"
                     "\n")
                .find("metrics.jsonl:1"),
            std::string::npos);
  EXPECT_EQ(error_of("\n\n"), "");  // blank lines are not steps
}

TEST(RunHistory, AResumedRunReplacesTheStepsWrittenAgain) {
  const RunHistory h = parse(
      "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":3,\"loss\":3}\n"
      "{\"step\":2,\"loss\":4.5}\n{\"step\":3,\"loss\":3.5}\n");
  EXPECT_EQ(h.steps, (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(h.find("moetron_loss")->values, (std::vector<double>{5, 4.5, 3.5}));
  ASSERT_EQ(h.events.size(), 1u);
  EXPECT_EQ(h.events[0].kind, "resume");
  EXPECT_EQ(h.events[0].step, 2);
}

struct TempRun {
  std::string dir = (fs::temp_directory_path() /
                     ("moetron_history_" + std::to_string(::getpid()) + "_" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                        .string();
  TempRun() {
    remove_tree(dir);
    fs::create_directories(dir);
  }
  ~TempRun() { remove_tree(dir); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir + "/" + name) << text;
  }
};

TEST(RunHistory, MissingMetricsFileIsAnErrorNamingThePath) {
  TempRun run;
  try {
    read_run_history(run.dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(run.dir + "/metrics.jsonl"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_run_history(run.dir + "/absent"), Error);
}

TEST(RunHistory, EventsAreReadAndMissingOnesDerived) {
  TempRun run;
  run.write("metrics.jsonl", kOldLines);
  fs::create_directories(run.dir + "/checkpoints/step-2");
  run.write("checkpoints/step-2/manifest.json", "{}");
  fs::create_directories(run.dir + "/checkpoints/step-1.tmp");  // not a checkpoint
  RunHistory h = read_run_history(run.dir);
  ASSERT_EQ(h.events.size(), 2u);
  EXPECT_EQ(h.events[0].kind, "skipped_step");  // from "skipped": true
  EXPECT_EQ(h.events[0].step, 2);
  EXPECT_EQ(h.events[1].kind, "checkpoint");  // from the checkpoint on disk
  EXPECT_TRUE(h.events[1].derived);
  run.write("events.jsonl",
            R"({"time":1,"step":2,"kind":"checkpoint","message":"saved","bytes":10})"
            "\n"
            R"({"time":2,"step":2,"kind":"skipped_step","message":"overflow"})"
            "\n"
            R"({"time":3,"step":1,"kind":"straggler","message":"rank 3","rank":3})"
            "\n"
            R"({"time":4,"step":2,"kind":"stop)");
  h = read_run_history(run.dir);
  ASSERT_EQ(h.events.size(), 3u);  // nothing derived twice; the partial line skipped
  EXPECT_EQ(h.events[0].kind, "straggler");
  EXPECT_EQ(h.events[0].fields["rank"], 3);
  EXPECT_FALSE(h.events[1].derived);
}

}  // namespace
}  // namespace moetron::monitor
