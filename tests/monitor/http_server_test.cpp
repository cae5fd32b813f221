// The monitor's HTTP server over real sockets: /metrics parsed back against
// the registry (and gzip scrapes on a kept connection without a delayed-ACK
// stall), the dashboard's history and events APIs, the embedded page and
// Chart.js, and a port that cannot be bound.
#include "moetron/monitor/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/monitor/dashboard_assets.h"
#include "moetron/monitor/prometheus_text.h"
#include "util/synthetic_run.h"
#include "util/test_util.h"

namespace moetron::monitor {
namespace {

ServerOptions any_port() {
  ServerOptions o;
  o.port = 0;
  return o;
}

httplib::Result get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(30);
  c.set_read_timeout(30);
  return c.Get(path);
}

TEST(MonitorServer, MetricsAreTheRegistryInTheTextFormat) {
  test::SyntheticRun run;
  MonitorServer server(run.registry(), any_port());
  ASSERT_GT(server.port(), 0);
  const nlohmann::json line = run.advance(7);

  auto res = get(server.port(), "/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const ParsedExposition parsed = parse_prometheus_text(res->body);
  EXPECT_EQ(parsed.type.at("moetron_comm_bytes_total"), "counter");
  EXPECT_EQ(parsed.type.at("moetron_loss"), "gauge");
  // Every series of the step's metrics.jsonl line, with the same value.
  ASSERT_GT(line["series"].size(), 50u);
  for (const auto& [key, value] : line["series"].items()) {
    EXPECT_EQ(parsed.value(key), value.get<double>()) << key;
  }
  EXPECT_EQ(parsed.samples.size(), line["series"].size());
  EXPECT_EQ(parsed.value("moetron_loss"), run.registry().get("moetron_loss").value());
}

// Prometheus keeps its connection and asks for gzip. Without TCP_NODELAY
// the compressed answer's last chunk waited for the client's delayed ACK:
// every scrape after the first took >= 40 ms (Linux's minimum delay).
TEST(MonitorServer, KeptAliveGzipScrapesDoNotWaitForDelayedAcks) {
  test::SyntheticRun run;
  MonitorServer server(run.registry(), any_port());
  run.advance(3);
  httplib::Client c("127.0.0.1", server.port());
  c.set_keep_alive(true);
  c.set_read_timeout(30);
  std::vector<double> ms;
  for (int i = 0; i < 11; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto res = c.Get("/metrics", {{"Accept-Encoding", "gzip"}});
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    ASSERT_EQ(res->status, 200);
    EXPECT_NO_THROW(parse_prometheus_text(res->body));
  }
  std::sort(ms.begin(), ms.end());
  // The median scrape: ~1 ms here, 44 ms with the delayed ACK.
  EXPECT_LT(ms[ms.size() / 2], 25.0);
}

TEST(MonitorServer, HistoryAnswersTheStepsAfterSince) {
  test::SyntheticRun run;
  MonitorServer server(run.registry(), any_port());
  auto empty = get(server.port(), "/api/history");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->body, "[]");
  for (int64_t s = 1; s <= 5; ++s) server.publish_step(run.advance(s));

  auto all = get(server.port(), "/api/history?since=-1");
  ASSERT_TRUE(all);
  EXPECT_EQ(all->get_header_value("Content-Type"), "application/json");
  const nlohmann::json lines = nlohmann::json::parse(all->body);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[4]["series"]["moetron_loss"], run.registry().get("moetron_loss").value());
  EXPECT_EQ(all->get_header_value("X-Moetron-Last"), "5");

  auto tail = get(server.port(), "/api/history?since=3");
  ASSERT_TRUE(tail);
  const nlohmann::json after3 = nlohmann::json::parse(tail->body);
  ASSERT_EQ(after3.size(), 2u);
  EXPECT_EQ(after3[0]["step"], 4);

  auto page = get(server.port(), "/api/history?since=0&limit=2");
  ASSERT_TRUE(page);
  EXPECT_EQ(nlohmann::json::parse(page->body).size(), 2u);
  EXPECT_EQ(page->get_header_value("X-Moetron-Last"), "2");

  auto status = get(server.port(), "/api/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(nlohmann::json::parse(status->body)["latest_step"], 5);

  auto bad = get(server.port(), "/api/history?since=abc");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THROW(server.publish_step(nlohmann::json{{"loss", 1.0}}), Error);  // no step
}

TEST(MonitorServer, EventsAreNumberedInPublicationOrder) {
  Registry registry;
  MonitorServer server(registry, any_port());
  server.publish_event({{"step", 0}, {"kind", "start"}, {"message", "run started"}});
  server.publish_event({{"step", 12}, {"kind", "checkpoint"}, {"message", "step-12"}});
  auto all = get(server.port(), "/api/events");
  ASSERT_TRUE(all);
  const nlohmann::json events = nlohmann::json::parse(all->body);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["kind"], "checkpoint");
  EXPECT_EQ(all->get_header_value("X-Moetron-Last"), "1");
  auto rest = get(server.port(), "/api/events?since=1");
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->body, "[]");
}

TEST(MonitorServer, ServesTheEmbeddedDashboardAndChartJs) {
  Registry registry;
  MonitorServer server(registry, any_port());
  auto page = get(server.port(), "/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("id=\"latest-step\""), std::string::npos);
  auto chart = get(server.port(), "/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_EQ(chart->status, 200);
  EXPECT_NE(chart->body.find("Chart.js v"), std::string::npos);
  EXPECT_GT(chart->body.size(), 100000u);
  // Every script the page names is served.
  for (const DashboardAsset& a : dashboard_assets()) {
    auto res = get(server.port(), std::string(a.path));
    ASSERT_TRUE(res) << a.path;
    EXPECT_EQ(res->status, 200) << a.path;
    EXPECT_EQ(res->body.size(), a.body.size()) << a.path;
    if (a.path != "/" && a.path != "/chart.js") {
      EXPECT_NE(page->body.find(std::string(a.path)), std::string::npos)
          << a.path << " is embedded but the page never loads it";
    }
  }
  auto missing = get(server.port(), "/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST(MonitorServer, APortInUseIsAnErrorNamingThePort) {
  Registry registry;
  MonitorServer first(registry, any_port());
  ServerOptions same;
  same.port = first.port();
  const std::string msg = test::error_of([&] { MonitorServer second(registry, same); });
  EXPECT_NE(msg.find("monitor.port " + std::to_string(first.port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("address already in use"), std::string::npos) << msg;

  // An address of no interface here (TEST-NET-1).
  ServerOptions elsewhere;
  elsewhere.port = 0;
  elsewhere.host = "192.0.2.1";
  const std::string away = test::error_of([&] { MonitorServer s(registry, elsewhere); });
  EXPECT_NE(away.find("cannot assign requested address"), std::string::npos) << away;
  EXPECT_NE(away.find("192.0.2.1"), std::string::npos) << away;
}

TEST(MonitorServer, StopsAtOnceWhenDestroyed) {
  Registry registry;
  for (int i = 0; i < 20; ++i) {
    MonitorServer server(registry, any_port());
    EXPECT_GT(server.port(), 0);
  }
}

}  // namespace
}  // namespace moetron::monitor
