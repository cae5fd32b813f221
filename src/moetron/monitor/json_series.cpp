#include "moetron/monitor/json_series.h"

#include <cmath>

namespace moetron::monitor {

namespace {

// JSON has no NaN or infinity: they are written as null (the report skips them).
nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}

}  // namespace

nlohmann::json json_series(const Snapshot& snapshot) {
  nlohmann::json out = nlohmann::json::object();
  for (const MetricSnapshot& m : snapshot) {
    const MetricDef& d = m.def;
    for (const SeriesValue& s : m.series) {
      if (d.kind == MetricKind::histogram) {
        out[series_key(d.name + "_sum", d.labels, s.labels)] = number(s.sum);
        out[series_key(d.name + "_count", d.labels, s.labels)] = s.count;
      } else {
        out[series_key(d.name, d.labels, s.labels)] = number(s.value);
      }
    }
  }
  return out;
}

}  // namespace moetron::monitor
