#include "util/prometheus_util.h"

#include <httplib.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "moetron/core/error.h"

namespace moetron::test {

bool prometheus_installed() {
  return ::access(kPrometheusBinary, X_OK) == 0;
}

PrometheusServer::PrometheusServer(const std::string& dir, const std::vector<std::string>& targets)
    : log_path_(dir + "/prometheus.log") {
  const std::string config = dir + "/prometheus.yml";
  {
    std::ofstream f(config);
    f << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
      << "scrape_configs:\n  - job_name: moetron\n    static_configs:\n      - targets: [";
    for (size_t i = 0; i < targets.size(); ++i) f << (i ? ", '" : "'") << targets[i] << "'";
    f << "]\n";
  }
  // The port was free a moment ago; another test may take it first: retry.
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = free_tcp_port();
    process_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kPrometheusBinary, "--config.file=" + config,
                                 "--storage.tsdb.path=" + dir + "/data",
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port_)},
        log_path_);
    const bool ready = poll_until(
        [&] {
          if (!process_->running()) return true;
          httplib::Client c("127.0.0.1", port_);
          auto res = c.Get("/-/ready");
          return res && res->status == 200;
        },
        30, 0.1);
    if (ready && process_->running()) return;
    process_->terminate();
  }
  throw Error("prometheus did not start; its log (" + log_path_ + "):\n" +
              read_text_file(log_path_));
}

std::string PrometheusServer::get(const std::string& path, const QueryParams& params) {
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(30);
  httplib::Params query;
  for (const auto& [k, v] : params) query.emplace(k, v);
  auto res = c.Get(path, query, httplib::Headers{});
  if (!res) throw Error("prometheus " + path + ": " + httplib::to_string(res.error()));
  if (res->status != 200) {
    throw Error("prometheus " + path + ": HTTP " + std::to_string(res->status) + ": " + res->body);
  }
  return res->body;
}

namespace {
nlohmann::json result_of(const std::string& body) {
  const nlohmann::json answer = nlohmann::json::parse(body);
  if (answer.value("status", "") != "success") throw Error("prometheus query failed: " + body);
  return answer["data"]["result"];
}
}  // namespace

std::vector<double> PrometheusServer::query(const std::string& promql) {
  std::vector<double> values;
  for (const auto& r : result_of(get("/api/v1/query", {{"query", promql}}))) {
    values.push_back(std::stod(r["value"][1].get<std::string>()));
  }
  return values;
}

std::vector<std::pair<double, double>> PrometheusServer::samples(const std::string& selector,
                                                                 double window_s, double at) {
  const std::string promql = selector + "[" + std::to_string(static_cast<int>(window_s)) + "s]";
  char time[32];
  std::snprintf(time, sizeof(time), "%.3f", at);
  const nlohmann::json result =
      result_of(get("/api/v1/query", {{"query", promql}, {"time", time}}));
  if (result.size() > 1)
    throw Error(selector + " matches " + std::to_string(result.size()) + " series");
  std::vector<std::pair<double, double>> out;
  if (result.empty()) return out;
  for (const auto& v : result[0]["values"]) {
    out.emplace_back(v[0].get<double>(), std::stod(v[1].get<std::string>()));
  }
  return out;
}

std::vector<double> PrometheusServer::wait_for_samples(const std::string& promql, size_t min_count,
                                                       double timeout_s) {
  std::vector<double> values;
  poll_until(
      [&] {
        values = query(promql);
        return values.size() >= min_count;
      },
      timeout_s, 0.2);
  return values;
}

std::string PrometheusServer::targets() {
  return get("/api/v1/targets");
}

}  // namespace moetron::test
