// A registry shaped like a training run's (the metric names of the monitor's
// metrics.jsonl schema, docs in train/), filled with made-up deterministic
// values, for the tests of the monitor's server, Prometheus scraping and the
// dashboard. Rank 2 turns straggler from step 30 on.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "moetron/monitor/metric_registry.h"

namespace moetron::test {

class SyntheticRun {
 public:
  SyntheticRun(int layers = 4, int experts = 8, int ranks = 4);

  monitor::Registry& registry() { return registry_; }
  // Writes step `step`'s values into the registry and returns its
  // metrics.jsonl line: the classic top-level keys, "time" and "series".
  nlohmann::json advance(int64_t step);

 private:
  monitor::Metric& define(const std::string& name, monitor::MetricKind kind,
                          const std::string& unit, std::vector<std::string> labels = {});

  int layers_, experts_, ranks_;
  monitor::Registry registry_;
};

}  // namespace moetron::test
