// `moetron report` end to end: a short training run of the tiny model, then
// its report (summary table, loss panel, one SVG per chart, all well-formed);
// a one-step run; bad input leaves any earlier report untouched; the CLI's
// exit status and message for a run directory without metrics.
#include "moetron/monitor/run_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/corpus.h"
#include "moetron/monitor/plot_ticks.h"
#include "moetron/train/trainer.h"
#include "monitor/xml_check.h"
#include "util/tiny_corpus.h"

namespace moetron::monitor {
namespace {

namespace fs = std::filesystem;

// The shared tiny corpus (tests/util/tiny_corpus.h); this test's runs live beside it.
const std::string& test_root() {
  return test::tiny_corpus_root();
}

// The corpus and runs are removed when the tests end.
class RemoveRoot : public ::testing::Environment {
 public:
  void TearDown() override { remove_tree(test_root()); }
};
[[maybe_unused]] ::testing::Environment* const kRemoveRoot =
    ::testing::AddGlobalTestEnvironment(new RemoveRoot);

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test_root() + "/" + name;
  remove_tree(d);
  fs::create_directories(d);
  return d;
}

TEST(RunReport, ReportOfAShortTrainingRun) {
  const std::string run = test_root() + "/runs/short";
  remove_tree(run);
  const train::Config cfg =
      train::load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml",
                         {"data.path=" + test_root() + "/prepared", "train.steps=4",
                          "train.eval_every=2", "checkpoint.every=2", "train.threads=1"});
  train::Trainer trainer(cfg, run, false);
  const train::TrainResult tr = trainer.run();
  ASSERT_EQ(tr.steps_done, 4);

  ReportOptions o;
  o.run_dir = run;
  const ReportResult r = write_run_report(o);
  EXPECT_EQ(r.html_path, run + "/report.html");
  EXPECT_EQ(r.summary.steps, 4);
  EXPECT_DOUBLE_EQ(r.summary.last_loss, tr.last_loss);
  EXPECT_EQ(r.summary.checkpoints, 2);  // step-2 and step-4 on disk
  const std::string html = read_file(r.html_path);
  EXPECT_NE(html.find("id=\"summary\""), std::string::npos);
  EXPECT_NE(html.find("<th>Steps</th><td>4 (steps 1 to 4)</td>"), std::string::npos);
  EXPECT_NE(html.find(" / " + format_number(tr.last_loss) + "</td>"), std::string::npos)
      << format_number(tr.last_loss);
  EXPECT_NE(html.find("dp 1"), std::string::npos);  // the layout, from the checkpoint's manifest
  EXPECT_NE(html.find("id=\"panel-loss\""), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // nothing fetched
  std::vector<std::string> svgs;
  for (const char* id : {"loss", "learning_rate", "grad_norm", "tokens_per_second", "mfu",
                         "step_time", "expert_load_layer_1", "expert_load_layer_3"}) {
    const std::string path = r.svg_dir + "/" + id + ".svg";
    ASSERT_TRUE(fs::exists(path)) << path;
    svgs.push_back(read_file(path));
    EXPECT_EQ(check_xml(svgs.back()), "") << path;
  }
  EXPECT_TRUE(python_parses_xml(svgs));
  for (const auto& e : fs::directory_iterator(run))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(RunReport, OneStepRunAndCustomPaths) {
  const std::string run = fresh_dir("one_step");
  std::ofstream(run + "/metrics.jsonl")
      << R"({"step":1,"loss":5.75,"lr":0.001,"grad_norm":1.5,"tokens_per_s":900,"mfu":0.02,"step_s":0.25,"skipped":false})"
      << "\n";
  ReportOptions o;
  o.run_dir = run;
  o.out_html = run + "/out/r.html";
  o.svg_dir = run + "/plots";
  const ReportResult r = write_run_report(o);
  EXPECT_EQ(r.summary.steps, 1);
  EXPECT_TRUE(fs::exists(run + "/out/r.html"));
  EXPECT_TRUE(fs::exists(run + "/plots/loss.svg"));
  const std::string html = read_file(run + "/out/r.html");
  EXPECT_NE(html.find("5.75 / 5.75"), std::string::npos);
  EXPECT_EQ(check_xml(read_file(run + "/plots/loss.svg")), "");
}

TEST(RunReport, BadMetricsLeaveTheEarlierReportUntouched) {
  const std::string run = fresh_dir("bad");
  std::ofstream(run + "/metrics.jsonl")
      << "{\"step\":1,\"loss\":5}\n{\"step\":2,\"lo\n{\"step\":3,\"loss\":4}\n";
  std::ofstream(run + "/report.html") << "earlier report";
  ReportOptions o;
  o.run_dir = run;
  try {
    write_run_report(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(run + "/metrics.jsonl:2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(run + "/report.html"), "earlier report");
}

#ifdef MOETRON_BINARY
TEST(RunReport, CliFailsNamingTheMissingMetricsFile) {
  const std::string run = fresh_dir("empty");
  const std::string log = run + "/log";
  const int rc =
      std::system((std::string(MOETRON_BINARY) + " report " + run + " > " + log + " 2>&1").c_str());
  EXPECT_NE(rc, 0);
  EXPECT_NE(read_file(log).find(run + "/metrics.jsonl"), std::string::npos) << read_file(log);
  std::ofstream(run + "/metrics.jsonl") << "{\"step\":1,\"loss\":5}\n";
  EXPECT_EQ(
      std::system((std::string(MOETRON_BINARY) + " report " + run + " > " + log + " 2>&1").c_str()),
      0);
  EXPECT_NE(read_file(log).find("wrote " + run + "/report.html"), std::string::npos)
      << read_file(log);
}
#endif

}  // namespace
}  // namespace moetron::monitor
