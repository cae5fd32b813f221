// The live dashboard in Debian's headless Chromium: the page loads Chart.js
// and the run's history from a MonitorServer, and its DOM shows the latest
// step, the panels with data, the expert-load heatmaps, the straggler and the
// events. Its screenshot is written to the build's Testing/ directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>

#include "moetron/monitor/http_server.h"
#include "util/subprocess.h"
#include "util/synthetic_run.h"

namespace moetron::monitor {
namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

// Runs headless Chromium on `url` (virtual time: the page's polling runs
// without waiting in real time) with `mode` (--dump-dom or --screenshot=F);
// its stdout.
std::string run_chromium(const std::string& dir, const std::string& url, const std::string& mode) {
  const std::string out = dir + "/chromium.out", err = dir + "/chromium.err";
  std::filesystem::remove(out);
  test::Subprocess chromium(
      {kChromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
       "--no-first-run", "--hide-scrollbars", "--user-data-dir=" + dir + "/profile",
       "--window-size=1400,2600", "--virtual-time-budget=8000", mode, url},
      out, err);
  const int code = chromium.wait(90);
  EXPECT_EQ(code, 0) << "chromium " << mode << " failed or timed out; its stderr (" << err << "):\n"
                     << test::read_text_file(err);
  return test::read_text_file(out);
}

// The opening tag of the element with this id ("" when absent).
std::string tag_of(const std::string& dom, const std::string& id) {
  const size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t open = dom.rfind('<', at);
  return dom.substr(open, dom.find('>', at) - open + 1);
}

TEST(DashboardChromium, ShowsTheLatestStepAndThePanels) {
  if (::access(kChromium, X_OK) != 0) {
    GTEST_SKIP() << "Debian's chromium (" << kChromium
                 << ") is not installed: bash scripts/install-deps.sh installs it";
  }
  test::SyntheticRun run;
  ServerOptions opts;
  opts.port = 0;
  MonitorServer server(run.registry(), opts);
  server.publish_event({{"time", 1.7e9}, {"step", 0}, {"kind", "start"}, {"message", "started"}});
  for (int64_t s = 1; s <= 80; ++s) {
    server.publish_step(run.advance(s));
    if (s == 30) {
      server.publish_event({{"time", 1.7e9 + s},
                            {"step", s},
                            {"kind", "straggler"},
                            {"message", "rank 2 is 1.6x the median step time"}});
    }
    if (s == 50) {
      server.publish_event({{"time", 1.7e9 + s},
                            {"step", s},
                            {"kind", "checkpoint"},
                            {"message", "checkpoints/step-50"}});
    }
  }
  const std::string dir = test::fresh_temp_dir("moetron_dashboard_test");
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/";

  const std::string dom = run_chromium(dir, url, "--dump-dom");
  ASSERT_FALSE(dom.empty());
  const std::regex latest("id=\"latest-step\"[^>]*>\\s*80\\s*<");
  EXPECT_TRUE(std::regex_search(dom, latest)) << "the page does not show step 80:\n"
                                              << dom.substr(0, 3000);
  for (const char* panel : {"panel-loss", "panel-grad-norm", "panel-throughput", "panel-memory",
                            "panel-comm-bytes", "panel-ranks", "panel-expert-load"}) {
    const std::string tag = tag_of(dom, panel);
    EXPECT_FALSE(tag.empty()) << panel;
    EXPECT_EQ(tag.find("hidden"), std::string::npos) << panel << " is hidden: " << tag;
  }
  // No series of these in the synthetic run: their panels stay hidden.
  EXPECT_NE(tag_of(dom, "panel-loss-scale").find("hidden"), std::string::npos);
  EXPECT_NE(dom.find("data-layer=\"3\""), std::string::npos) << "no heatmap for MoE layer 3";
  EXPECT_NE(dom.find("Straggler: rank 2"), std::string::npos);
  EXPECT_NE(dom.find("checkpoints/step-50"), std::string::npos) << "events not listed";

  const std::string png = std::string(MOETRON_TEST_OUTPUT_DIR) + "/dashboard.png";
  std::filesystem::create_directories(MOETRON_TEST_OUTPUT_DIR);
  std::filesystem::remove(png);
  run_chromium(dir, url, "--screenshot=" + png);
  ASSERT_TRUE(std::filesystem::exists(png)) << png;
  EXPECT_EQ(test::read_text_file(png).substr(1, 3), "PNG");
  // A page of charts, not a blank one: blank 1400x2600 PNGs are a few kB.
  EXPECT_GT(std::filesystem::file_size(png), 50000u);
  std::printf("dashboard screenshot: %s\n", png.c_str());
}

}  // namespace
}  // namespace moetron::monitor
