// Metrics in one registry: counters, gauges and histograms with labels, each
// defined once with its unit and help text. Exporters (metrics.jsonl, the
// Prometheus endpoint, the dashboard) read a Snapshot; the training loop
// writes through Metric handles. What a metric means is its definer's
// business (train/training_metrics); this file only keeps the numbers.
//
// Thread-safe: the trainer writes while the HTTP server thread snapshots.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace moetron::monitor {

enum class MetricKind { counter, gauge, histogram };
const char* name_of(MetricKind k);

struct MetricDef {
  std::string name;  // Prometheus naming: [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in _total
  MetricKind kind = MetricKind::gauge;
  std::string unit;  // base unit: "seconds", "bytes", "ratio", "tokens", "" (dimensionless)
  std::string help;
  std::vector<std::string> labels;  // label names; each series gives one value per name
  std::vector<double> buckets;      // histograms: upper bounds, increasing (+Inf is implied)
  int64_t max_series = 1024;        // label cardinality bound: more series is an error
};

// Label values, in the order of MetricDef::labels.
using LabelValues = std::vector<std::string>;

struct SeriesValue {
  LabelValues labels;
  double value = 0;                     // counter or gauge
  std::vector<uint64_t> bucket_counts;  // histogram: cumulative counts per bucket, then +Inf
  double sum = 0;                       // histogram
  uint64_t count = 0;                   // histogram
};

struct MetricSnapshot {
  MetricDef def;
  std::vector<SeriesValue> series;  // ordered by label values
};
using Snapshot = std::vector<MetricSnapshot>;  // in definition order

class Registry;

// A handle to one defined metric. Writing to a series creates it; a value
// list of the wrong length, a negative counter increment or a series beyond
// max_series throws naming the metric.
class Metric {
 public:
  const MetricDef& def() const { return def_; }
  void set(const LabelValues& labels, double v);      // gauge
  void add(const LabelValues& labels, double v);      // counter (v >= 0) or gauge
  void observe(const LabelValues& labels, double v);  // histogram
  void set(double v) { set({}, v); }
  void add(double v) { add({}, v); }
  void observe(double v) { observe({}, v); }
  // The current value of a counter or gauge series (0 when it does not exist).
  double value(const LabelValues& labels = {}) const;
  int64_t series_count() const;

 private:
  friend class Registry;
  Metric(MetricDef def, std::mutex* mu) : def_(std::move(def)), mu_(mu) {}
  SeriesValue& series_locked(const LabelValues& labels);

  MetricDef def_;
  std::mutex* mu_;
  std::map<LabelValues, SeriesValue> series_;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Throws on an invalid or duplicate name, invalid label names, a counter
  // not ending in _total, or histogram buckets not increasing.
  Metric& define(MetricDef def);
  // Throws naming the metric when it was never defined.
  Metric& get(std::string_view name);
  const Metric* find(std::string_view name) const;
  std::vector<const MetricDef*> definitions() const;  // in definition order
  int64_t series_count() const;
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Metric>> metrics_;
};

// `name{a="x",b="y"}` (just `name` without labels): the series' key in the
// Prometheus text format and in metrics.jsonl.
std::string series_key(const std::string& name, const std::vector<std::string>& label_names,
                       const LabelValues& values);
// Escapes a label value for the text format: backslash, double quote, newline.
std::string escape_label_value(std::string_view v);
bool valid_metric_name(std::string_view name);
bool valid_label_name(std::string_view name);

}  // namespace moetron::monitor
