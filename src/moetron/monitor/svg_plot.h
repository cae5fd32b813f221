// SVG charts for run reports, written by hand: a line chart (axes with round
// ticks, legend, optional log y axis, stacked areas, marked points and
// vertical event markers) and a heatmap with its colour scale. Each render
// returns one standalone <svg> element (it carries its xmlns, so the same
// text is a valid .svg file and can be inlined in HTML). Non-finite values
// are skipped (a line breaks around them); a single point is drawn as a dot.
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace moetron::monitor {

struct LineSeries {
  std::string name;
  std::vector<double> x, y;
  std::string color;    // empty: the next colour of the palette
  bool dashed = false;  // e.g. a peak beside its current value
  bool dots = false;    // a dot at every point (sparse series: validation loss)
};

// Points drawn as rings over the lines (stragglers on per-rank step times).
struct PointSet {
  std::string name;
  std::vector<double> x, y;
  std::string color = "#d62728";
};

// A vertical line at x (a step) coloured by kind; the label is its tooltip.
struct EventMarker {
  double x = 0;
  std::string kind, label;
};

struct LineChart {
  std::string title, x_label = "step", y_label;
  bool log_y = false;    // non-positive values are skipped
  bool stacked = false;  // stacked areas: every series has the same x
  std::vector<LineSeries> series;
  std::vector<PointSet> points;
  std::vector<EventMarker> events;
  int width = 700, height = 320;
};

struct Heatmap {
  std::string title, x_label = "step", y_label, value_label;
  std::vector<double> x;                    // column positions, ascending
  std::vector<std::string> rows;            // row labels, top to bottom
  std::vector<std::vector<double>> values;  // values[row][column]; NaN: no data
  double vmin = NAN, vmax = NAN;            // colour range; NaN: the data's
  int width = 700, height = 260;
};

std::string render_line_chart(const LineChart& chart);
std::string render_heatmap(const Heatmap& map);

// &, <, >, " and ' as entities.
std::string xml_escape(std::string_view s);
// The palette's i-th colour (ten, repeating) and an event kind's colour.
std::string palette_color(size_t i);
std::string event_color(const std::string& kind);

}  // namespace moetron::monitor
