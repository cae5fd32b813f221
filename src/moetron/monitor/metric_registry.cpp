#include "moetron/monitor/metric_registry.h"

#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"

namespace moetron::monitor {

const char* name_of(MetricKind k) {
  switch (k) {
    case MetricKind::counter:
      return "counter";
    case MetricKind::gauge:
      return "gauge";
    case MetricKind::histogram:
      return "histogram";
  }
  return "untyped";
}

namespace {

bool name_char(char c, bool first, bool colon_ok) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (alpha || (colon_ok && c == ':')) return true;
  return !first && c >= '0' && c <= '9';
}

bool valid_name(std::string_view s, bool colon_ok) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!name_char(s[i], i == 0, colon_ok)) return false;
  }
  return true;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

void check_definition(const MetricDef& def) {
  MOETRON_CHECK(valid_metric_name(def.name), "metric name '", def.name,
                "' is not a valid Prometheus name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  MOETRON_CHECK(def.kind != MetricKind::counter || ends_with(def.name, "_total"), "counter '",
                def.name, "' must end in _total (Prometheus naming)");
  MOETRON_CHECK(def.kind == MetricKind::counter || !ends_with(def.name, "_total"), "metric '",
                def.name, "' ends in _total but is a ", name_of(def.kind));
  MOETRON_CHECK(!def.help.empty(), "metric '", def.name, "' has no help text");
  for (size_t i = 0; i < def.labels.size(); ++i) {
    const std::string& l = def.labels[i];
    MOETRON_CHECK(valid_label_name(l) && l.rfind("__", 0) != 0 && l != "le", "metric '", def.name,
                  "': label name '", l, "' is not allowed");
    for (size_t j = 0; j < i; ++j) {
      MOETRON_CHECK(def.labels[j] != l, "metric '", def.name, "': label '", l, "' given twice");
    }
  }
  MOETRON_CHECK(def.kind == MetricKind::histogram || def.buckets.empty(), "metric '", def.name,
                "': only histograms have buckets");
  if (def.kind == MetricKind::histogram) {
    MOETRON_CHECK(!def.buckets.empty(), "histogram '", def.name, "' has no buckets");
    for (size_t i = 0; i < def.buckets.size(); ++i) {
      MOETRON_CHECK(
          std::isfinite(def.buckets[i]) && (i == 0 || def.buckets[i] > def.buckets[i - 1]),
          "histogram '", def.name, "': buckets must be finite and increasing");
    }
  }
  MOETRON_CHECK(def.max_series >= 1, "metric '", def.name, "': max_series must be >= 1");
}

}  // namespace

bool valid_metric_name(std::string_view name) {
  return valid_name(name, true);
}
bool valid_label_name(std::string_view name) {
  return valid_name(name, false);
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string series_key(const std::string& name, const std::vector<std::string>& label_names,
                       const LabelValues& values) {
  if (label_names.empty()) return name;
  std::string key = name + "{";
  for (size_t i = 0; i < label_names.size(); ++i) {
    if (i) key += ",";
    key += label_names[i] + "=\"" + escape_label_value(values.at(i)) + "\"";
  }
  return key + "}";
}

SeriesValue& Metric::series_locked(const LabelValues& labels) {
  MOETRON_CHECK(labels.size() == def_.labels.size(), "metric '", def_.name, "' takes ",
                def_.labels.size(), " label values, got ", labels.size());
  auto it = series_.find(labels);
  if (it != series_.end()) return it->second;
  MOETRON_CHECK(static_cast<int64_t>(series_.size()) < def_.max_series, "metric '", def_.name,
                "' would exceed its bound of ", def_.max_series, " series (label values ",
                series_key(def_.name, def_.labels, labels), ")");
  SeriesValue s;
  s.labels = labels;
  if (def_.kind == MetricKind::histogram) s.bucket_counts.assign(def_.buckets.size() + 1, 0);
  return series_.emplace(labels, std::move(s)).first->second;
}

void Metric::set(const LabelValues& labels, double v) {
  MOETRON_CHECK(def_.kind == MetricKind::gauge, "set() on ", name_of(def_.kind), " '", def_.name,
                "': only gauges are set");
  std::lock_guard<std::mutex> lock(*mu_);
  series_locked(labels).value = v;
}

void Metric::add(const LabelValues& labels, double v) {
  MOETRON_CHECK(def_.kind != MetricKind::histogram, "add() on histogram '", def_.name,
                "': use observe()");
  MOETRON_CHECK(def_.kind != MetricKind::counter || v >= 0, "counter '", def_.name,
                "' cannot decrease (add ", v, ")");
  std::lock_guard<std::mutex> lock(*mu_);
  series_locked(labels).value += v;
}

void Metric::observe(const LabelValues& labels, double v) {
  MOETRON_CHECK(def_.kind == MetricKind::histogram, "observe() on ", name_of(def_.kind), " '",
                def_.name, "': only histograms observe");
  std::lock_guard<std::mutex> lock(*mu_);
  SeriesValue& s = series_locked(labels);
  // Cumulative, as the exposition format wants: every bucket whose bound
  // is >= v counts it, and +Inf always does.
  for (size_t i = 0; i < def_.buckets.size(); ++i) {
    if (v <= def_.buckets[i]) ++s.bucket_counts[i];
  }
  ++s.bucket_counts.back();
  s.sum += v;
  ++s.count;
}

double Metric::value(const LabelValues& labels) const {
  std::lock_guard<std::mutex> lock(*mu_);
  auto it = series_.find(labels);
  return it == series_.end() ? 0.0 : it->second.value;
}

int64_t Metric::series_count() const {
  std::lock_guard<std::mutex> lock(*mu_);
  return static_cast<int64_t>(series_.size());
}

Metric& Registry::define(MetricDef def) {
  check_definition(def);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& m : metrics_) {
    MOETRON_CHECK(m->def().name != def.name, "metric '", def.name, "' is defined twice");
  }
  metrics_.push_back(std::unique_ptr<Metric>(new Metric(std::move(def), &mu_)));
  return *metrics_.back();
}

const Metric* Registry::find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& m : metrics_) {
    if (m->def().name == name) return m.get();
  }
  return nullptr;
}

Metric& Registry::get(std::string_view name) {
  const Metric* m = find(name);
  MOETRON_CHECK(m != nullptr, "metric '", name, "' is not defined");
  return *const_cast<Metric*>(m);
}

std::vector<const MetricDef*> Registry::definitions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const MetricDef*> out;
  for (const auto& m : metrics_) out.push_back(&m->def());
  return out;
}

int64_t Registry::series_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& m : metrics_) n += static_cast<int64_t>(m->series_.size());
  return n;
}

Snapshot Registry::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot out;
  out.reserve(metrics_.size());
  for (const auto& m : metrics_) {
    MetricSnapshot ms;
    ms.def = m->def();
    for (const auto& [labels, s] : m->series_) ms.series.push_back(s);
    out.push_back(std::move(ms));
  }
  return out;
}

}  // namespace moetron::monitor
