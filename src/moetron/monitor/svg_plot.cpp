#include "moetron/monitor/svg_plot.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

#include "moetron/monitor/plot_ticks.h"

namespace moetron::monitor {

namespace {

constexpr double kLeft = 66, kRight = 18, kTop = 30, kBottom = 42;
constexpr double kLegendRow = 16;
constexpr size_t kMaxLegend = 14;
constexpr double kCharWidth = 6.2;  // 11px sans-serif, an average glyph
const char* kFont = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// The plot area and the data range it shows (y in log10 on a log axis).
struct Frame {
  double left = 0, top = 0, width = 0, height = 0;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool log_y = false;
  double px(double x) const { return left + (x - x0) / (x1 - x0) * width; }
  double py(double y) const {
    const double v = log_y ? std::log10(y) : y;
    return top + height - (v - y0) / (y1 - y0) * height;
  }
  bool has_x(double x) const { return x >= x0 - 1e-9 && x <= x1 + 1e-9; }
};

struct LegendEntry {
  std::string label, color;
  bool dashed = false, ring = false, bar = false;
};

void open_svg(std::string& s, int w, int h) {
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(w) + "\" height=\"" +
       std::to_string(h) + "\" viewBox=\"0 0 " + std::to_string(w) + " " + std::to_string(h) +
       "\" " + kFont + " font-size=\"11\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(w) + "\" height=\"" + std::to_string(h) +
       "\" fill=\"#ffffff\"/>\n";
}

void text(std::string& s, double x, double y, const std::string& t, const std::string& extra = "") {
  s += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + (extra.empty() ? "" : " " + extra) +
       ">" + xml_escape(t) + "</text>\n";
}

void line(std::string& s, double x0, double y0, double x1, double y1, const std::string& style) {
  s += "<line x1=\"" + num(x0) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x1) + "\" y2=\"" +
       num(y1) + "\" " + style + "/>\n";
}

double legend_width(const LegendEntry& e) {
  return 26 + kCharWidth * static_cast<double>(e.label.size()) + 12;
}

// Rows the legend needs within `width` (0 without entries).
int legend_rows(const std::vector<LegendEntry>& entries, double width) {
  if (entries.empty()) return 0;
  int rows = 1;
  double x = 0;
  for (const auto& e : entries) {
    if (x > 0 && x + legend_width(e) > width) ++rows, x = 0;
    x += legend_width(e);
  }
  return rows;
}

void draw_legend(std::string& s, const std::vector<LegendEntry>& entries, double left, double top,
                 double width) {
  double x = 0, y = top;
  for (const auto& e : entries) {
    if (x > 0 && x + legend_width(e) > width) x = 0, y += kLegendRow;
    const double cx = left + x, cy = y + 8;
    if (e.bar) {
      s += "<rect x=\"" + num(cx) + "\" y=\"" + num(cy - 5) +
           "\" width=\"18\" height=\"10\" fill=\"" + e.color + "\" fill-opacity=\"0.75\"/>\n";
    } else if (e.ring) {
      s += "<circle cx=\"" + num(cx + 9) + "\" cy=\"" + num(cy) +
           "\" r=\"4\" fill=\"none\" stroke=\"" + e.color + "\" stroke-width=\"1.5\"/>\n";
    } else {
      line(s, cx, cy, cx + 18, cy,
           "stroke=\"" + e.color + "\" stroke-width=\"2\"" +
               (e.dashed ? " stroke-dasharray=\"4 3\"" : ""));
    }
    text(s, cx + 24, cy + 4, e.label, "fill=\"#333333\"");
    x += legend_width(e);
  }
}

std::vector<LegendEntry> legend_of(const LineChart& c, const std::vector<std::string>& colors) {
  std::vector<LegendEntry> out;
  // One line needs no legend (the title names it).
  const bool lone = c.series.size() == 1 && !c.stacked;
  for (size_t i = 0; i < c.series.size() && !lone; ++i)
    out.push_back({c.series[i].name, colors[i], c.series[i].dashed, false, c.stacked});
  for (const auto& p : c.points) out.push_back({p.name, p.color, false, true, false});
  std::vector<std::string> kinds;
  for (const auto& e : c.events)
    if (std::find(kinds.begin(), kinds.end(), e.kind) == kinds.end()) kinds.push_back(e.kind);
  for (const auto& k : kinds) out.push_back({k, event_color(k), true, false, false});
  if (out.size() > kMaxLegend) {
    const size_t more = out.size() - (kMaxLegend - 1);
    out.resize(kMaxLegend - 1);
    out.push_back({"+" + std::to_string(more) + " more", "#ffffff", false, false, false});
  }
  return out;
}

// The y values a chart draws: each series' own, or the running sums when stacked.
std::vector<std::vector<double>> drawn_values(const LineChart& c) {
  std::vector<std::vector<double>> ys;
  for (const auto& s : c.series) ys.push_back(s.y);
  if (!c.stacked) return ys;
  for (size_t i = 0; i < ys.size(); ++i) {
    for (size_t j = 0; j < ys[i].size(); ++j) {
      const double v = std::isfinite(ys[i][j]) ? std::max(ys[i][j], 0.0) : 0.0;
      ys[i][j] = v + (i > 0 && j < ys[i - 1].size() ? ys[i - 1][j] : 0.0);
    }
  }
  return ys;
}

bool usable(double y, bool log_y) {
  return std::isfinite(y) && (!log_y || y > 0);
}

// The frame's data range and the ticks of both axes.
void fit_frame(const LineChart& c, const std::vector<std::vector<double>>& ys, Frame& f,
               std::vector<double>& xt, std::vector<double>& yt) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  const auto take = [&](double x, double y) {
    if (!std::isfinite(x) || !usable(y, c.log_y)) return;
    xmin = std::min(xmin, x), xmax = std::max(xmax, x);
    ymin = std::min(ymin, y), ymax = std::max(ymax, y);
  };
  for (size_t i = 0; i < c.series.size(); ++i)
    for (size_t j = 0; j < c.series[i].x.size() && j < ys[i].size(); ++j)
      take(c.series[i].x[j], ys[i][j]);
  for (const auto& p : c.points)
    for (size_t j = 0; j < p.x.size() && j < p.y.size(); ++j) take(p.x[j], p.y[j]);
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymin = c.log_y ? 1 : 0, ymax = c.log_y ? 10 : 1;
  if (c.stacked) ymin = std::min(ymin, 0.0);
  xt = nice_ticks(xmin, xmax, 6, true);
  f.x0 = xt.front(), f.x1 = xt.back();
  f.log_y = c.log_y;
  if (!c.log_y) {
    // A little headroom, so that no line runs along the frame (not below a zero baseline).
    const double pad = (ymax - ymin) * 0.03;
    yt = nice_ticks(ymin >= 0 ? std::max(0.0, ymin - pad) : ymin - pad, ymax + pad, 5);
    f.y0 = yt.front(), f.y1 = yt.back();
    return;
  }
  const double l0 = std::log10(ymin), l1 = std::log10(ymax);
  const double pad = l1 > l0 ? (l1 - l0) * 0.06 : 0.05;
  f.y0 = l0 - pad, f.y1 = l1 + pad;
  yt = log_ticks(std::pow(10.0, f.y0), std::pow(10.0, f.y1));
}

void draw_axes(std::string& s, const Frame& f, const std::vector<double>& xt,
               const std::vector<double>& yt, const LineChart& c, bool grid = true) {
  const auto xl = tick_labels(xt), yl = tick_labels(yt);
  const double bottom = f.top + f.height, right = f.left + f.width;
  for (size_t i = 0; i < yt.size(); ++i) {
    const double y = f.py(yt[i]);
    line(s, f.left, y, right, y, "stroke=\"#e6e6e6\" stroke-width=\"1\"");
    text(s, f.left - 6, y + 4, yl[i], "text-anchor=\"end\" fill=\"#444444\"");
  }
  for (size_t i = 0; i < xt.size(); ++i) {
    if (!f.has_x(xt[i])) continue;
    const double x = f.px(xt[i]);
    if (grid) line(s, x, f.top, x, bottom, "stroke=\"#f0f0f0\" stroke-width=\"1\"");
    line(s, x, bottom, x, bottom + 4, "stroke=\"#444444\"");
    text(s, x, bottom + 16, xl[i], "text-anchor=\"middle\" fill=\"#444444\"");
  }
  s += "<rect x=\"" + num(f.left) + "\" y=\"" + num(f.top) + "\" width=\"" + num(f.width) +
       "\" height=\"" + num(f.height) + "\" fill=\"none\" stroke=\"#888888\"/>\n";
  text(s, f.left + f.width / 2, bottom + 34, c.x_label, "text-anchor=\"middle\" fill=\"#333333\"");
  const double ly = f.top + f.height / 2;
  text(s, 14, ly, c.y_label + (c.log_y ? " (log)" : ""),
       "text-anchor=\"middle\" fill=\"#333333\" transform=\"rotate(-90 14 " + num(ly) + ")\"");
}

// At most two points per pixel column (the extremes), so that a long run
// stays a small file and keeps its spikes.
std::vector<std::pair<double, double>> decimate(const std::vector<std::pair<double, double>>& pts,
                                                double width) {
  if (pts.size() <= static_cast<size_t>(2 * width)) return pts;
  std::vector<std::pair<double, double>> out;
  size_t i = 0;
  while (i < pts.size()) {
    size_t j = i, lo = i, hi = i;
    const double col = std::floor(pts[i].first);
    while (j < pts.size() && std::floor(pts[j].first) == col) {
      if (pts[j].second < pts[lo].second) lo = j;
      if (pts[j].second > pts[hi].second) hi = j;
      ++j;
    }
    out.push_back(pts[std::min(lo, hi)]);
    if (lo != hi) out.push_back(pts[std::max(lo, hi)]);
    i = j;
  }
  return out;
}

void draw_polyline(std::string& s, const std::vector<std::pair<double, double>>& seg,
                   const Frame& f, const std::string& style) {
  if (seg.size() == 1) {
    s += "<circle cx=\"" + num(seg[0].first) + "\" cy=\"" + num(seg[0].second) + "\" r=\"2.5\" " +
         style + "/>\n";
    return;
  }
  std::string pts;
  for (const auto& p : decimate(seg, f.width)) pts += num(p.first) + "," + num(p.second) + " ";
  s += "<polyline fill=\"none\" " + style + " points=\"" + pts + "\"/>\n";
}

void draw_series(std::string& s, const Frame& f, const LineSeries& ls, const std::string& color) {
  const std::string stroke = "stroke=\"" + color + "\" stroke-width=\"1.6\"" +
                             (ls.dashed ? " stroke-dasharray=\"5 3\"" : "");
  const std::string dot = "fill=\"" + color + "\" stroke=\"none\"";
  std::vector<std::pair<double, double>> seg;
  const auto flush = [&] {
    if (!seg.empty()) draw_polyline(s, seg, f, seg.size() == 1 ? dot : stroke);
    seg.clear();
  };
  for (size_t j = 0; j < ls.x.size() && j < ls.y.size(); ++j) {
    if (!std::isfinite(ls.x[j]) || !usable(ls.y[j], f.log_y)) {
      flush();
      continue;
    }
    seg.emplace_back(f.px(ls.x[j]), f.py(ls.y[j]));
    if (ls.dots)
      s += "<circle cx=\"" + num(seg.back().first) + "\" cy=\"" + num(seg.back().second) +
           "\" r=\"2.5\" " + dot + "/>\n";
  }
  flush();
}

void draw_stacked(std::string& s, const Frame& f, const LineChart& c,
                  const std::vector<std::vector<double>>& ys,
                  const std::vector<std::string>& colors) {
  for (size_t i = 0; i < c.series.size(); ++i) {
    const auto& x = c.series[i].x;
    if (x.empty()) continue;
    std::string pts;
    for (size_t j = 0; j < x.size(); ++j) pts += num(f.px(x[j])) + "," + num(f.py(ys[i][j])) + " ";
    for (size_t j = x.size(); j-- > 0;) {
      const double below = i > 0 && j < ys[i - 1].size() ? ys[i - 1][j] : 0.0;
      pts += num(f.px(x[j])) + "," + num(f.py(below)) + " ";
    }
    s += "<polygon fill=\"" + colors[i] + "\" fill-opacity=\"0.75\" stroke=\"" + colors[i] +
         "\" stroke-width=\"0.8\" points=\"" + pts + "\"/>\n";
  }
}

void draw_events(std::string& s, const Frame& f, const std::vector<EventMarker>& events) {
  for (const auto& e : events) {
    if (!f.has_x(e.x)) continue;
    const double x = f.px(e.x);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(f.top) + "\" x2=\"" + num(x) + "\" y2=\"" +
         num(f.top + f.height) + "\" stroke=\"" + event_color(e.kind) +
         "\" stroke-width=\"1.2\" stroke-dasharray=\"4 3\" opacity=\"0.85\"><title>" +
         xml_escape(e.label.empty() ? e.kind : e.label) + "</title></line>\n";
  }
}

void draw_points(std::string& s, const Frame& f, const PointSet& p) {
  for (size_t j = 0; j < p.x.size() && j < p.y.size(); ++j) {
    if (!std::isfinite(p.x[j]) || !usable(p.y[j], f.log_y)) continue;
    s += "<circle cx=\"" + num(f.px(p.x[j])) + "\" cy=\"" + num(f.py(p.y[j])) +
         "\" r=\"4.5\" fill=\"none\" stroke=\"" + p.color + "\" stroke-width=\"1.8\"/>\n";
  }
}

// Viridis, from its published anchor colours: t in [0, 1].
std::string viridis(double t) {
  static const double stops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                     {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                     {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 8;
  const int i = std::min(7, static_cast<int>(t));
  const double u = t - i;
  char buf[8];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x",
                static_cast<int>(std::lround(stops[i][0] + u * (stops[i + 1][0] - stops[i][0]))),
                static_cast<int>(std::lround(stops[i][1] + u * (stops[i + 1][1] - stops[i][1]))),
                static_cast<int>(std::lround(stops[i][2] + u * (stops[i + 1][2] - stops[i][2]))));
  return buf;
}

// Averages groups of neighbouring columns down to at most `max_cols`
// (NaN-aware); returns the column positions and binned values.
void bin_columns(const Heatmap& m, size_t max_cols, std::vector<double>& x,
                 std::vector<std::vector<double>>& v) {
  const size_t n = m.x.size(), per = (n + max_cols - 1) / std::max<size_t>(max_cols, 1);
  v.assign(m.values.size(), {});
  for (size_t c = 0; c < n; c += std::max<size_t>(per, 1)) {
    const size_t end = std::min(n, c + per);
    x.push_back((m.x[c] + m.x[end - 1]) / 2);  // the bin's middle
    for (size_t r = 0; r < m.values.size(); ++r) {
      double sum = 0;
      int cnt = 0;
      for (size_t k = c; k < std::min(n, c + per) && k < m.values[r].size(); ++k)
        if (std::isfinite(m.values[r][k])) sum += m.values[r][k], ++cnt;
      v[r].push_back(cnt > 0 ? sum / cnt : NAN);
    }
  }
}

void draw_colour_bar(std::string& s, double left, double top, double height, double vmin,
                     double vmax, const std::string& label) {
  constexpr int kSteps = 32;
  const double h = height / kSteps;
  for (int i = 0; i < kSteps; ++i) {
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(top + height - (i + 1) * h) +
         "\" width=\"12\" height=\"" + num(h + 0.5) + "\" fill=\"" + viridis((i + 0.5) / kSteps) +
         "\"/>\n";
  }
  const auto ticks = nice_ticks(vmin, vmax, 4);
  const auto labels = tick_labels(ticks);
  for (size_t i = 0; i < ticks.size(); ++i) {
    if (ticks[i] < vmin - 1e-12 || ticks[i] > vmax + 1e-12) continue;
    const double y = top + height - (ticks[i] - vmin) / (vmax - vmin) * height;
    line(s, left + 12, y, left + 15, y, "stroke=\"#444444\"");
    text(s, left + 17, y + 4, labels[i], "fill=\"#444444\"");
  }
  text(s, left, top - 6, label, "fill=\"#333333\"");
}

void colour_range(const std::vector<std::vector<double>>& v, double& vmin, double& vmax) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& row : v)
    for (double x : row)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!std::isfinite(vmin)) vmin = std::isfinite(lo) ? lo : 0;
  if (!std::isfinite(vmax)) vmax = std::isfinite(hi) ? hi : 1;
  if (!(vmax > vmin)) vmax = vmin + (vmin != 0 ? std::fabs(vmin) * 0.1 : 1);
}

}  // namespace

std::string xml_escape(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (char ch : in) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n') break;
        out += ch;
    }
  }
  return out;
}

std::string palette_color(size_t i) {
  static const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                 "#b07aa1", "#edc948", "#ff9da7", "#9c755f", "#7f7f7f"};
  return colors[i % 10];
}

std::string event_color(const std::string& kind) {
  static const std::map<std::string, std::string> colors = {
      {"checkpoint", "#2ca02c"}, {"skipped_step", "#d62728"}, {"restart", "#9467bd"},
      {"resume", "#9467bd"},     {"straggler", "#ff7f0e"},    {"loss_spike", "#bcbd22"},
      {"error", "#8c0000"},      {"stop", "#555555"},         {"start", "#555555"}};
  const auto it = colors.find(kind);
  return it == colors.end() ? "#17becf" : it->second;
}

std::string render_line_chart(const LineChart& c) {
  std::vector<std::string> colors;
  for (size_t i = 0; i < c.series.size(); ++i)
    colors.push_back(c.series[i].color.empty() ? palette_color(i) : c.series[i].color);
  const auto legend = legend_of(c, colors);
  const double plot_w = c.width - kLeft - kRight;
  const int rows = legend_rows(legend, plot_w);
  Frame f;
  f.left = kLeft;
  f.top = kTop + rows * kLegendRow + (rows > 0 ? 4 : 0);
  f.width = plot_w;
  f.height = std::max(40.0, c.height - f.top - kBottom);
  const auto ys = drawn_values(c);
  std::vector<double> xt, yt;
  fit_frame(c, ys, f, xt, yt);
  std::string s;
  open_svg(s, c.width, c.height);
  text(s, kLeft, 18, c.title, "font-size=\"13\" font-weight=\"bold\" fill=\"#222222\"");
  draw_legend(s, legend, kLeft, kTop - 4, plot_w);
  draw_axes(s, f, xt, yt, c);
  if (c.stacked) draw_stacked(s, f, c, ys, colors);
  draw_events(s, f, c.events);
  if (!c.stacked)
    for (size_t i = 0; i < c.series.size(); ++i) draw_series(s, f, c.series[i], colors[i]);
  for (const auto& p : c.points) draw_points(s, f, p);
  s += "</svg>\n";
  return s;
}

std::string render_heatmap(const Heatmap& m) {
  constexpr double kBar = 78;
  Frame f;
  f.left = kLeft;
  f.top = kTop + 6;
  f.width = m.width - kLeft - kBar;
  f.height = std::max(40.0, m.height - f.top - kBottom);
  std::vector<double> x;
  std::vector<std::vector<double>> v;
  bin_columns(m, static_cast<size_t>(f.width / 4), x, v);
  double vmin = m.vmin, vmax = m.vmax;
  colour_range(v, vmin, vmax);
  // Column c is centred on x[c], its edges halfway to its neighbours.
  std::vector<double> edges;
  if (x.empty()) edges = {0, 1};
  for (size_t c = 0; c < x.size(); ++c) {
    const double half =
        x.size() > 1 ? (c + 1 < x.size() ? x[c + 1] - x[c] : x[c] - x[c - 1]) / 2 : 0.5;
    if (c == 0) edges.push_back(x[0] - (x.size() > 1 ? (x[1] - x[0]) / 2 : 0.5));
    edges.push_back(x[c] + half);
  }
  f.x0 = edges.front(), f.x1 = edges.back();
  std::string s;
  open_svg(s, m.width, m.height);
  text(s, kLeft, 18, m.title, "font-size=\"13\" font-weight=\"bold\" fill=\"#222222\"");
  const size_t rows = std::max<size_t>(m.rows.size(), 1);
  const double rh = f.height / static_cast<double>(rows);
  const size_t label_every = std::max<size_t>(1, static_cast<size_t>(std::ceil(12 / rh)));
  for (size_t r = 0; r < m.rows.size() && r < v.size(); ++r) {
    const double y = f.top + static_cast<double>(r) * rh;
    for (size_t c = 0; c < x.size(); ++c) {
      const double x0 = f.px(edges[c]), x1 = f.px(edges[c + 1]);
      const double val = v[r][c];
      s += "<rect x=\"" + num(x0) + "\" y=\"" + num(y) + "\" width=\"" + num(x1 - x0 + 0.4) +
           "\" height=\"" + num(rh + 0.4) + "\" fill=\"" +
           (std::isfinite(val) ? viridis((val - vmin) / (vmax - vmin)) : "#dddddd") + "\"/>\n";
    }
    if (r % label_every == 0)
      text(s, f.left - 6, y + rh / 2 + 4, m.rows[r], "text-anchor=\"end\" fill=\"#444444\"");
  }
  LineChart axes;  // the frame, the step ticks and the axis titles, without y ticks
  axes.x_label = m.x_label;
  axes.y_label = m.y_label;
  std::vector<double> xt;
  for (double t : nice_ticks(f.x0, f.x1, 6, true))
    if (f.has_x(t)) xt.push_back(t);
  f.y0 = 0, f.y1 = 1;
  draw_axes(s, f, xt, {}, axes, false);
  draw_colour_bar(s, f.left + f.width + 12, f.top + 14, f.height - 14, vmin, vmax, m.value_label);
  s += "</svg>\n";
  return s;
}

}  // namespace moetron::monitor
