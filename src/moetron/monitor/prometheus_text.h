// The Prometheus text exposition format (version 0.0.4): written from a
// registry Snapshot for /metrics, and parsed back strictly (tests, and
// tools that read a scrape).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moetron/monitor/metric_registry.h"

namespace moetron::monitor {

std::string prometheus_text(const Snapshot& snapshot);

// A number as the format writes it: shortest round-trip decimal, NaN, +Inf, -Inf.
std::string format_sample_value(double v);

struct ParsedSample {
  std::string name;  // with _bucket/_sum/_count for histograms
  std::vector<std::pair<std::string, std::string>> labels;  // as written, unescaped
  double value = 0;
  std::string key() const;  // series_key() of name and labels
};

struct ParsedExposition {
  std::map<std::string, std::string> type;  // metric family -> counter|gauge|histogram|...
  std::map<std::string, std::string> help;
  std::vector<ParsedSample> samples;
  // The value of the series with this key; throws when absent.
  double value(const std::string& key) const;
};

// Throws naming the line on anything malformed.
ParsedExposition parse_prometheus_text(const std::string& text);

}  // namespace moetron::monitor
