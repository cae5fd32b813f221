#include "moetron/monitor/metric_registry.h"

#include <gtest/gtest.h>

#include <cmath>

#include "moetron/core/error.h"
#include "moetron/monitor/json_series.h"
#include "moetron/monitor/prometheus_text.h"

namespace moetron::monitor {
namespace {

MetricDef gauge(const std::string& name, std::vector<std::string> labels = {}) {
  MetricDef d;
  d.name = name;
  d.kind = MetricKind::gauge;
  d.unit = "ratio";
  d.help = "a test gauge";
  d.labels = std::move(labels);
  return d;
}

TEST(MetricRegistry, DefinitionsFollowPrometheusNaming) {
  Registry r;
  EXPECT_THROW(r.define(gauge("2bad")), Error);
  EXPECT_THROW(r.define(gauge("has space")), Error);
  MetricDef counter = gauge("moetron_steps");
  counter.kind = MetricKind::counter;
  EXPECT_THROW(r.define(counter), Error);  // a counter must end in _total
  counter.name = "moetron_steps_total";
  EXPECT_NO_THROW(r.define(counter));
  EXPECT_THROW(r.define(gauge("moetron_gauge_total")), Error);
  EXPECT_THROW(r.define(gauge("moetron_x", {"le"})), Error);  // reserved for histograms
  EXPECT_THROW(r.define(gauge("moetron_x", {"a", "a"})), Error);
  EXPECT_THROW(r.define(gauge("moetron_steps_total")), Error);  // defined twice
  MetricDef no_help = gauge("moetron_y");
  no_help.help.clear();
  EXPECT_THROW(r.define(no_help), Error);
}

TEST(MetricRegistry, UnknownNameIsAnErrorAtLookup) {
  Registry r;
  r.define(gauge("moetron_loss"));
  EXPECT_NO_THROW(r.get("moetron_loss"));
  try {
    r.get("moetron_los");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moetron_los"), std::string::npos);
  }
}

TEST(MetricRegistry, LabelCardinalityIsBounded) {
  Registry r;
  MetricDef d = gauge("moetron_load", {"expert"});
  d.max_series = 4;
  Metric& m = r.define(d);
  for (int e = 0; e < 4; ++e) m.set({std::to_string(e)}, e);
  m.set({"3"}, 7);  // an existing series is always writable
  EXPECT_THROW(m.set({"4"}, 1), Error);
  EXPECT_THROW(m.set({"0", "extra"}, 1), Error);  // wrong number of label values
  EXPECT_EQ(m.series_count(), 4);
  EXPECT_EQ(m.value({"3"}), 7);
}

TEST(MetricRegistry, CountersOnlyGoUpAndKindsAreKept) {
  Registry r;
  MetricDef c = gauge("moetron_bytes_total");
  c.kind = MetricKind::counter;
  Metric& m = r.define(c);
  m.add(3);
  m.add(4);
  EXPECT_EQ(m.value(), 7);
  EXPECT_THROW(m.add(-1), Error);
  EXPECT_THROW(m.set(1), Error);
  EXPECT_THROW(m.observe(1), Error);
}

TEST(PrometheusText, WritesTheExpositionAndParsesItBack) {
  Registry r;
  Metric& loss = r.define(gauge("moetron_loss"));
  loss.set(3.25);
  Metric& load = r.define(gauge("moetron_expert_load_ratio", {"layer", "expert"}));
  load.set({"0", "1"}, 0.125);
  load.set({"a\"b\\c\nd", "2"}, NAN);  // escapes and non-finite values survive
  MetricDef h = gauge("moetron_step_seconds_hist");
  h.kind = MetricKind::histogram;
  h.unit = "seconds";
  h.buckets = {0.1, 1, 10};
  Metric& hist = r.define(h);
  for (double v : {0.05, 0.5, 0.5, 5.0, 50.0}) hist.observe(v);
  r.define(gauge("moetron_unused"));  // no series: not written

  const std::string text = prometheus_text(r.snapshot());
  EXPECT_EQ(text.find("moetron_unused"), std::string::npos);
  const ParsedExposition p = parse_prometheus_text(text);
  EXPECT_EQ(p.type.at("moetron_loss"), "gauge");
  EXPECT_EQ(p.type.at("moetron_step_seconds_hist"), "histogram");
  EXPECT_EQ(p.help.at("moetron_loss"), "a test gauge (ratio)");
  EXPECT_EQ(p.value("moetron_loss"), 3.25);
  EXPECT_EQ(p.value(R"(moetron_expert_load_ratio{layer="0",expert="1"})"), 0.125);
  EXPECT_TRUE(std::isnan(p.value(R"(moetron_expert_load_ratio{layer="a\"b\\c\nd",expert="2"})")));
  EXPECT_EQ(p.value(R"(moetron_step_seconds_hist_bucket{le="0.1"})"), 1);
  EXPECT_EQ(p.value(R"(moetron_step_seconds_hist_bucket{le="1"})"), 3);
  EXPECT_EQ(p.value(R"(moetron_step_seconds_hist_bucket{le="10"})"), 4);
  EXPECT_EQ(p.value(R"(moetron_step_seconds_hist_bucket{le="+Inf"})"), 5);
  EXPECT_EQ(p.value("moetron_step_seconds_hist_count"), 5);
  EXPECT_DOUBLE_EQ(p.value("moetron_step_seconds_hist_sum"), 56.05);

  const nlohmann::json j = json_series(r.snapshot());
  EXPECT_EQ(j.at("moetron_loss").get<double>(), 3.25);
  EXPECT_EQ(j.at(R"(moetron_expert_load_ratio{layer="0",expert="1"})").get<double>(), 0.125);
  EXPECT_TRUE(j.at(R"(moetron_expert_load_ratio{layer="a\"b\\c\nd",expert="2"})").is_null());
  EXPECT_EQ(j.at("moetron_step_seconds_hist_count").get<int>(), 5);
}

TEST(PrometheusText, MalformedLinesNameTheirNumber) {
  EXPECT_THROW(parse_prometheus_text("moetron_x{a=\"1\" 2\n"), Error);
  EXPECT_THROW(parse_prometheus_text("moetron_x 2x\n"), Error);
  try {
    parse_prometheus_text("# TYPE moetron_x gauge\nmoetron_x 1\nmoetron_y{a=1} 2\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(format_sample_value(0.1), "0.1");
  EXPECT_EQ(format_sample_value(-INFINITY), "-Inf");
}

}  // namespace
}  // namespace moetron::monitor
