// The live dashboard in Debian's headless Chromium: the page loads Chart.js
// and the run's history from a MonitorServer, and its DOM shows the latest
// step, the panels with data, the expert-load heatmaps, the straggler and the
// events. Its screenshot is written to the build's Testing/ directory.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "moetron/monitor/http_server.h"
#include "util/chromium_util.h"
#include "util/subprocess.h"
#include "util/synthetic_run.h"

namespace moetron::monitor {
namespace {

TEST(DashboardChromium, ShowsTheLatestStepAndThePanels) {
  if (!test::chromium_installed()) {
    GTEST_SKIP() << "Debian's chromium (" << test::kChromiumBinary
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
  std::filesystem::create_directories(MOETRON_TEST_OUTPUT_DIR);
  const std::string png = std::string(MOETRON_TEST_OUTPUT_DIR) + "/dashboard.png";

  const std::string dom = test::load_in_chromium(dir, url, png);
  ASSERT_FALSE(dom.empty());
  EXPECT_EQ(test::element_text(dom, "latest-step"), "80") << dom.substr(0, 3000);
  for (const char* panel : {"panel-loss", "panel-grad-norm", "panel-throughput", "panel-memory",
                            "panel-comm-bytes", "panel-ranks", "panel-expert-load"}) {
    const std::string tag = test::element_tag(dom, panel);
    EXPECT_FALSE(tag.empty()) << panel;
    EXPECT_EQ(tag.find("hidden"), std::string::npos) << panel << " is hidden: " << tag;
  }
  // No series of these in the synthetic run: their panels stay hidden.
  EXPECT_NE(test::element_tag(dom, "panel-loss-scale").find("hidden"), std::string::npos);
  EXPECT_NE(dom.find("data-layer=\"3\""), std::string::npos) << "no heatmap for MoE layer 3";
  EXPECT_NE(dom.find("Straggler: rank 2"), std::string::npos);
  EXPECT_NE(dom.find("checkpoints/step-50"), std::string::npos) << "events not listed";

  ASSERT_TRUE(std::filesystem::exists(png)) << png;
  EXPECT_EQ(test::read_text_file(png).substr(1, 3), "PNG");
  // A page of charts, not a blank one: blank 1400x2600 PNGs are a few kB.
  EXPECT_GT(std::filesystem::file_size(png), 50000u);
  std::printf("dashboard screenshot: %s\n", png.c_str());
}

}  // namespace
}  // namespace moetron::monitor
