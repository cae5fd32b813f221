// A real training run (the moetron binary on configs/tiny.toml, a corpus
// this test prepares) with monitor.serve on: headless Chromium opens its
// dashboard while it trains and shows a step the run has written, and
// Debian's Prometheus scrapes it and answers, for every scrape, the values of
// the run's metrics.jsonl line for the step it scraped (loss, tokens/s, one
// expert-load series). The run is stopped once both have seen it.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "util/chromium_util.h"
#include "util/prometheus_util.h"
#include "util/subprocess.h"

namespace moetron {
namespace {

using StepLines = std::map<int64_t, nlohmann::json>;  // step -> its metrics.jsonl line

// A corpus of short sentences prepared by the binary itself.
std::string prepare_corpus(const std::string& dir) {
  std::filesystem::create_directories(dir + "/text");
  std::ofstream f(dir + "/text/notes");
  const char* words[] = {"red",  "fox",   "runs", "past", "old",
                         "barn", "under", "grey", "sky",  "now"};
  for (int d = 0; d < 300; ++d) {
    f << words[d % 10] << " " << words[(d * 7) % 10] << " " << words[(d * 3 + 1) % 10] << ".\n%\n";
  }
  f.close();
  test::Subprocess prep({MOETRON_BINARY, "prepare-data", "--input", dir + "/text", "--out",
                         dir + "/prepared", "--vocab-size", "300", "--val-fraction", "0.1"},
                        dir + "/prepare.log");
  EXPECT_EQ(prep.wait(120), 0) << test::read_text_file(dir + "/prepare.log");
  return dir + "/prepared";
}

// The complete lines of metrics.jsonl so far (a line being written is left out).
StepLines read_lines(const std::string& path) {
  StepLines lines;
  std::istringstream in(test::read_text_file(path));
  std::string text;
  while (std::getline(in, text)) {
    if (in.eof()) break;  // no newline yet: still being written
    const nlohmann::json line = nlohmann::json::parse(text);
    lines[line["step"].get<int64_t>()] = line;
  }
  return lines;
}

int64_t served_step(int port) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/api/status");
  if (!res || res->status != 200) return -1;
  const nlohmann::json s = nlohmann::json::parse(res->body);
  return s["latest_step"].is_number() ? s["latest_step"].get<int64_t>() : -1;
}

// Each scrape of `key` equals that series in the line of the step the same
// scrape saw, or of a neighbouring step: a scrape may land while the trainer
// is recording a step's metrics. `steps`: the scrapes of moetron_step.
void expect_scrapes_match(test::PrometheusServer& prom, const std::string& key, double at,
                          const std::vector<std::pair<double, double>>& steps,
                          const StepLines& lines) {
  std::map<double, double> got;  // scrape time -> value
  for (const auto& [t, v] : prom.samples(key, 120, at)) got[t] = v;
  int compared = 0;
  for (const auto& [t, step] : steps) {
    const auto s = static_cast<int64_t>(step);
    if (s < 1) continue;  // scraped before the first step ended
    ASSERT_TRUE(got.count(t)) << key << " missing from the scrape of step " << s;
    bool found = false;
    for (int64_t near = s - 1; near <= s + 1 && !found; ++near) {
      const auto it = lines.find(near);
      found = it != lines.end() && it->second["series"].contains(key) &&
              it->second["series"][key].get<double>() == got[t];
    }
    EXPECT_TRUE(found) << key << " = " << got[t] << " scraped at step " << s
                       << " is in no metrics.jsonl line of steps " << s - 1 << ".." << s + 1;
    ++compared;
  }
  EXPECT_GE(compared, 2) << key;
}

// The scrapes that saw at least one finished step.
size_t scrapes_of_steps(const std::vector<std::pair<double, double>>& steps) {
  size_t n = 0;
  for (const auto& [t, step] : steps) n += step >= 1 ? 1 : 0;
  return n;
}

TEST(TrainingRunMonitor, PrometheusAndTheDashboardSeeTheRun) {
  if (!test::prometheus_installed()) {
    GTEST_SKIP() << "Debian's prometheus (" << test::kPrometheusBinary
                 << ") is not installed: bash scripts/install-deps.sh installs it";
  }
  const std::string dir = test::fresh_temp_dir("moetron_monitor_run");
  const std::string corpus = prepare_corpus(dir);
  const int port = test::free_tcp_port();
  // Prometheus first: it applies its targets on a 5 s tick after start-up.
  test::PrometheusServer prom(dir, {"127.0.0.1:" + std::to_string(port)});
  const std::string run = dir + "/run";
  test::Subprocess train(
      {MOETRON_BINARY, "train", "--config", MOETRON_SOURCE_DIR "/configs/tiny.toml", "--out", run,
       // A wider model and batch than tiny's: ~300x its FLOPs per step, so
       // the run writes about ten lines a second (measured: ~145 a second at
       // d_model 128, micro-batch 4, which buried the dashboard under 150 MB
       // of history within the test) rather than hundreds for it to load.
       "--set", "data.path=" + corpus, "--set", "model.d_model=256", "--set", "train.seq_len=32",
       "--set", "train.micro_batch=16", "--set", "train.steps=1000000", "--set",
       "monitor.serve=true", "--set", "monitor.port=" + std::to_string(port)},
      dir + "/train.log");
  ASSERT_TRUE(test::poll_until([&] { return served_step(port) >= 3 || !train.running(); }, 60))
      << test::read_text_file(dir + "/train.log");
  ASSERT_TRUE(train.running()) << test::read_text_file(dir + "/train.log");
  EXPECT_EQ(test::read_text_file(run + "/monitor.url"),
            "http://127.0.0.1:" + std::to_string(port) + "/\n");

  if (test::chromium_installed()) {
    const std::string png = std::string(MOETRON_TEST_OUTPUT_DIR) + "/dashboard_training_run.png";
    std::filesystem::create_directories(MOETRON_TEST_OUTPUT_DIR);
    const std::string dom =
        test::load_in_chromium(dir, "http://127.0.0.1:" + std::to_string(port) + "/", png, 3000);
    const std::string shown = test::element_text(dom, "latest-step");
    ASSERT_FALSE(shown.empty() || shown == "–") << dom.substr(0, 2000);
    EXPECT_TRUE(read_lines(run + "/metrics.jsonl").count(std::stoll(shown)))
        << "the dashboard shows step " << shown << ", which metrics.jsonl does not have";
    std::printf("dashboard of the training run: %s\n", png.c_str());
  } else {
    std::printf("chromium is not installed: the dashboard part is skipped\n");
  }

  // Two scrapes at least, then every scrape up to now compared.
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  std::vector<std::pair<double, double>> steps;
  double at = 0;
  ASSERT_TRUE(test::poll_until(
      [&] {
        at = now();
        steps = prom.samples("moetron_step", 120, at);
        return scrapes_of_steps(steps) >= 2 || !train.running();
      },
      60, 0.25))
      << "prometheus scraped the run " << steps.size() << " times; targets: " << prom.targets();
  ASSERT_GE(scrapes_of_steps(steps), 2u) << test::read_text_file(dir + "/train.log");
  // Until metrics.jsonl has the steps after the last one scraped.
  const int64_t last_scraped = static_cast<int64_t>(steps.back().second);
  ASSERT_TRUE(test::poll_until(
      [&] { return read_lines(run + "/metrics.jsonl").count(last_scraped + 1) > 0; }, 60));
  train.terminate();
  const StepLines lines = read_lines(run + "/metrics.jsonl");

  std::string expert_load;
  for (const auto& [key, value] : lines.begin()->second["series"].items()) {
    if (key.rfind("moetron_expert_load_ratio{", 0) == 0) {
      expert_load = key;
      break;
    }
  }
  ASSERT_FALSE(expert_load.empty()) << "no expert-load series in metrics.jsonl";
  for (const std::string& key :
       {std::string("moetron_loss"), std::string("moetron_tokens_per_second"), expert_load}) {
    expect_scrapes_match(prom, key, at, steps, lines);
  }
  if (!HasFailure()) std::filesystem::remove_all(dir + "/run");  // tens of MB of metrics.jsonl
}

}  // namespace
}  // namespace moetron
