// Debian's Prometheus server, run by a test: a generated config that scrapes
// the given targets every second, its storage in a temporary directory, and
// instant queries through its HTTP API.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "util/subprocess.h"

namespace moetron::test {

inline constexpr const char* kPrometheusBinary = "/usr/bin/prometheus";
bool prometheus_installed();

// Query parameters (name, value) of an HTTP API call.
using QueryParams = std::vector<std::pair<std::string, std::string>>;

class PrometheusServer {
 public:
  // Starts Prometheus (job "moetron", scrape_interval 1s) with its config,
  // data and log under `dir`, and waits until it is ready (30 s). Throws
  // moetron::Error with its log when it does not start.
  PrometheusServer(const std::string& dir, const std::vector<std::string>& targets);

  // The values of an instant query's result ([] when it has none yet);
  // throws when the query itself fails.
  std::vector<double> query(const std::string& promql);
  // The samples of one series over the `window_s` seconds before `at`
  // (unix seconds), as (timestamp, value), oldest first: a range query
  // `selector[window]` evaluated at a fixed time, so two selectors see the
  // same scrapes. Throws when the selector matches more than one series.
  std::vector<std::pair<double, double>> samples(const std::string& selector, double window_s,
                                                 double at);
  // Polls `query` until it answers at least `min_count` samples or
  // `timeout_s` passes; the last answer.
  std::vector<double> wait_for_samples(const std::string& promql, size_t min_count,
                                       double timeout_s);
  // /api/v1/targets, for failure messages (it names a failed scrape's error).
  std::string targets();
  const std::string& log_path() const { return log_path_; }
  int port() const { return port_; }

 private:
  std::string get(const std::string& path, const QueryParams& params = {});

  std::string log_path_;
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace moetron::test
