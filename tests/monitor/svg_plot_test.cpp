// The report's SVG charts: round tick values, well-formed XML (a small tag
// checker here, and python3's xml.etree where python3 exists), non-finite
// values skipped, one-point and empty charts, heatmaps.
#include "moetron/monitor/svg_plot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "moetron/monitor/plot_ticks.h"
#include "monitor/xml_check.h"

namespace moetron::monitor {
namespace {

// step = m * 10^k with m in {1, 2, 5}.
bool is_nice_step(double step) {
  const double k = std::floor(std::log10(step) + 1e-9);
  const double m = step / std::pow(10.0, k);
  return std::fabs(m - 1) < 1e-9 || std::fabs(m - 2) < 1e-9 || std::fabs(m - 5) < 1e-9;
}

TEST(PlotTicks, TicksAreRoundMultiplesCoveringTheRange) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> exp10(-7, 9), unit(0, 1);
  for (int trial = 0; trial < 2000; ++trial) {
    const double scale = std::pow(10.0, exp10(gen));
    const double lo = (unit(gen) - 0.3) * scale, hi = lo + unit(gen) * scale;
    const auto t = nice_ticks(lo, hi, 5);
    ASSERT_GE(t.size(), 2u);
    ASSERT_LE(t.size(), 12u) << lo << " " << hi;
    const double step = t[1] - t[0];
    EXPECT_TRUE(is_nice_step(step)) << step;
    EXPECT_LE(t.front(), lo);
    EXPECT_GE(t.back(), hi);
    for (double v : t) {
      const double k = v / step;
      EXPECT_NEAR(k, std::round(k), 1e-6) << v << " / " << step;
    }
  }
  EXPECT_EQ(nice_ticks(0.37, 9.81, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(1, 3, 6, true), (std::vector<double>{1, 2, 3}));  // steps: integers
  EXPECT_GE(nice_ticks(4.2, 4.2, 5).size(), 2u);                         // one value
}

TEST(PlotTicks, LabelsAreShortRoundNumbers) {
  EXPECT_EQ(tick_labels({0, 2, 4, 6, 8, 10}),
            (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
  EXPECT_EQ(tick_labels({0, 0.05, 0.1, 0.15}),
            (std::vector<std::string>{"0", "0.05", "0.10", "0.15"}));
  EXPECT_EQ(tick_labels({0, 200000, 400000}), (std::vector<std::string>{"0", "200k", "400k"}));
  EXPECT_EQ(tick_labels({0, 5e8, 1e9}), (std::vector<std::string>{"0", "0.5G", "1.0G"}));
  EXPECT_EQ(tick_labels({0, 2e-5, 4e-5}), (std::vector<std::string>{"0", "2e-5", "4e-5"}));
  EXPECT_EQ(tick_labels({-1, 0, 1}), (std::vector<std::string>{"-1", "0", "1"}));
  EXPECT_EQ(format_number(NAN), "-");
  EXPECT_EQ(format_number(123456.0), "123.5k");
}

TEST(PlotTicks, LogTicksAreDecadesOrRoundValues) {
  EXPECT_EQ(log_ticks(0.5, 500), (std::vector<double>{0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500}));
  EXPECT_EQ(log_ticks(0.5, 20000), (std::vector<double>{1, 10, 100, 1000, 10000}));
  EXPECT_EQ(log_ticks(1e-3, 1e6).front(), 1e-3);
  for (double v : log_ticks(1e-3, 1e6)) EXPECT_TRUE(is_nice_step(v)) << v;
  EXPECT_EQ(log_ticks(2.9, 6.1), (std::vector<double>{3, 3.5, 4, 4.5, 5, 5.5, 6}));
}

// The text of every tick label in an SVG (text anchored at the end or the middle).
std::vector<std::string> svg_texts(const std::string& svg) {
  std::vector<std::string> out;
  const std::regex re("<text[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator();
       ++it)
    out.push_back((*it)[1]);
  return out;
}

LineChart sample_chart() {
  LineChart c;
  c.title = "Loss <&> \"quoted\"";
  c.y_label = "loss";
  LineSeries a;
  a.name = "train";
  for (int i = 1; i <= 50; ++i) {
    a.x.push_back(i);
    a.y.push_back(i == 10 ? NAN : i == 20 ? INFINITY : 0.37 + 9.44 * (i - 1) / 49.0);
  }
  c.series.push_back(a);
  c.events.push_back({25, "checkpoint", "step 25: saved"});
  c.events.push_back({500, "restart", "outside the range: not drawn"});
  c.points.push_back({"straggler", {30}, {5}, "#d62728"});
  return c;
}

TEST(SvgPlot, LineChartIsWellFormedWithRoundTicksAndSkipsNonFinite) {
  const std::string svg = render_line_chart(sample_chart());
  EXPECT_EQ(check_xml(svg), "");
  EXPECT_TRUE(python_parses_xml({svg}));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  EXPECT_NE(svg.find("Loss &lt;&amp;&gt; &quot;quoted&quot;"), std::string::npos);
  const auto texts = svg_texts(svg);
  for (const char* tick : {"0", "2", "4", "6", "8", "10", "20", "30", "40", "50"})
    EXPECT_NE(std::find(texts.begin(), texts.end(), tick), texts.end()) << tick;
  // NaN at step 10 and inf at 20 break the line into three polylines.
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++lines;
  EXPECT_EQ(lines, 3u);
  EXPECT_NE(svg.find("step 25: saved"), std::string::npos);
  EXPECT_EQ(svg.find("outside the range"), std::string::npos);
}

TEST(SvgPlot, OnePointEmptyLogAndStackedChartsRender) {
  LineChart one;
  one.title = "one step";
  one.series.push_back({"loss", {1}, {5.5}, "", false, false});
  const std::string s1 = render_line_chart(one);
  EXPECT_EQ(check_xml(s1), "");
  EXPECT_NE(s1.find("<circle"), std::string::npos);  // a lone point is a dot
  LineChart empty;
  empty.title = "nothing";
  empty.series.push_back({"all NaN", {1, 2}, {NAN, NAN}, "", false, false});
  EXPECT_EQ(check_xml(render_line_chart(empty)), "");
  LineChart log = sample_chart();
  log.log_y = true;
  log.series[0].y[0] = -1;  // skipped on a log axis
  EXPECT_EQ(check_xml(render_line_chart(log)), "");
  LineChart st;
  st.stacked = true;
  st.series.push_back({"forward", {1, 2, 3}, {0.1, 0.2, NAN}, "", false, false});
  st.series.push_back({"backward", {1, 2, 3}, {0.2, 0.3, 0.3}, "", false, false});
  const std::string s4 = render_line_chart(st);
  EXPECT_EQ(check_xml(s4), "");
  EXPECT_NE(s4.find("<polygon"), std::string::npos);
  EXPECT_TRUE(python_parses_xml({s1, s4, render_line_chart(log), render_line_chart(empty)}));
}

TEST(SvgPlot, HeatmapIsWellFormedWithItsColourScale) {
  Heatmap m;
  m.title = "Expert load, layer 1";
  m.value_label = "token share";
  for (int s = 1; s <= 400; ++s) m.x.push_back(s);
  for (int e = 0; e < 4; ++e) {
    m.rows.push_back(std::to_string(e));
    m.values.emplace_back();
    for (int s = 1; s <= 400; ++s) m.values.back().push_back(s == 7 ? NAN : 0.25 + 0.1 * e - 0.15);
  }
  const std::string svg = render_heatmap(m);
  EXPECT_EQ(check_xml(svg), "");
  EXPECT_TRUE(python_parses_xml({svg}));
  EXPECT_NE(svg.find("token share"), std::string::npos);
  size_t rects = 0;
  for (size_t p = svg.find("<rect"); p != std::string::npos; p = svg.find("<rect", p + 1)) ++rects;
  EXPECT_LT(rects, 4u * 400u);  // columns binned to the width
  EXPECT_GT(rects, 4u * 50u);
  Heatmap one;
  one.x = {3};
  one.rows = {"0"};
  one.values = {{0.5}};
  EXPECT_EQ(check_xml(render_heatmap(one)), "");
}

TEST(XmlCheck, CatchesUnbalancedTags) {
  EXPECT_EQ(check_xml("<a><b/></a>"), "");
  EXPECT_NE(check_xml("<a><b></a>"), "");
  EXPECT_NE(check_xml("<a>x & y</a>"), "");
  EXPECT_NE(check_xml("<a>"), "");
  if (!python3().empty()) {
    EXPECT_FALSE(python_parses_xml({"<a><b></a>"}));
  }
}

}  // namespace
}  // namespace moetron::monitor
