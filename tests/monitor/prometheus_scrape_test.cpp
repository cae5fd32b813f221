// Debian's real Prometheus server scrapes a MonitorServer, and the values its
// HTTP API answers are the ones of the metrics.jsonl line the run wrote for
// the same step. Prometheus applies new scrape targets on a fixed 5 s tick,
// so the test takes about 7 s whatever the machine.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "moetron/monitor/http_server.h"
#include "util/prometheus_util.h"
#include "util/subprocess.h"
#include "util/synthetic_run.h"

namespace moetron::monitor {
namespace {

TEST(PrometheusScrape, QueriedValuesAreTheMetricsJsonlValues) {
  if (!test::prometheus_installed()) {
    GTEST_SKIP() << "Debian's prometheus (" << test::kPrometheusBinary
                 << ") is not installed: bash scripts/install-deps.sh installs it";
  }
  test::SyntheticRun run;
  ServerOptions opts;
  opts.port = 0;
  MonitorServer server(run.registry(), opts);
  nlohmann::json line;
  for (int64_t s = 1; s <= 12; ++s) {
    line = run.advance(s);
    server.publish_step(line);
  }

  const std::string dir = test::fresh_temp_dir("moetron_prometheus_test");
  test::PrometheusServer prom(dir, {"127.0.0.1:" + std::to_string(server.port())});
  const nlohmann::json& series = line["series"];
  const std::vector<std::string> keys = {"moetron_loss", "moetron_tokens_per_second",
                                         "moetron_expert_load_ratio{layer=\"3\",expert=\"5\"}",
                                         "moetron_comm_bytes_total{axis=\"ep\",op=\"all_to_all\"}"};
  for (const std::string& key : keys) {
    ASSERT_TRUE(series.contains(key)) << key;
    const std::vector<double> got = prom.wait_for_samples(key, 1, 30);
    ASSERT_EQ(got.size(), 1u) << key << "\nprometheus log: " << prom.log_path()
                              << "\ntargets: " << prom.targets();
    EXPECT_EQ(got[0], series[key].get<double>()) << key;
  }
  // The whole scrape: as many moetron series as the line has.
  const std::vector<double> all = prom.wait_for_samples("{__name__=~\"moetron_.*\"}", 1, 30);
  EXPECT_EQ(all.size(), series.size());
  EXPECT_EQ(prom.wait_for_samples("up{job=\"moetron\"}", 1, 30), std::vector<double>{1.0});
}

}  // namespace
}  // namespace moetron::monitor
