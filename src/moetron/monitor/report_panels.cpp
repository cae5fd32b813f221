#include "moetron/monitor/report_panels.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "moetron/monitor/svg_plot.h"

namespace moetron::monitor {

namespace {

// Label values to series, in label order.
using LabelMap = std::map<std::string, const Series*,
                          std::function<bool(const std::string&, const std::string&)>>;

LabelMap by_label(const RunHistory& h, const std::string& name, const std::string& label) {
  LabelMap m(label_less);
  for (const auto& [key, s] : h.named(name)) m[key.label(label)] = s;
  return m;
}

LineSeries line_of(const Series& s, const std::string& name, double scale = 1.0) {
  LineSeries l;
  l.name = name;
  l.x = s.steps;
  for (double v : s.values) l.y.push_back(v * scale);
  return l;
}

// A gauge's series, or the mean per interval of its histogram (name_sum / name_count).
const Series* gauge_or_mean(const RunHistory& h, const std::string& key, Series& storage) {
  if (const Series* s = h.find(key)) return s;
  const size_t brace = key.find('{');
  const std::string name = key.substr(0, brace),
                    labels = brace == std::string::npos ? "" : key.substr(brace);
  const Series* sum = h.find(name + "_sum" + labels);
  const Series* count = h.find(name + "_count" + labels);
  if (!sum || !count) return nullptr;
  const Series ds = counter_rate(*sum), dc = counter_rate(*count);
  const std::vector<double> c = values_at(dc, ds.steps);
  storage = {};
  for (size_t i = 0; i < ds.steps.size(); ++i) {
    storage.steps.push_back(ds.steps[i]);
    storage.values.push_back(c[i] > 0 ? ds.values[i] / c[i] : NAN);
  }
  return &storage;
}

std::vector<EventMarker> markers_of(const RunHistory& h) {
  std::vector<EventMarker> out;
  for (const auto& e : h.events) {
    if (e.step < 0 || e.kind == "start") continue;
    out.push_back({static_cast<double>(e.step), e.kind,
                   "step " + std::to_string(e.step) + ": " + e.kind +
                       (e.message.empty() ? "" : " - " + e.message)});
  }
  return out;
}

// True when the positive values of the series span more than `ratio`.
bool wide_range(const std::vector<LineSeries>& series, double ratio) {
  double lo = INFINITY, hi = 0;
  for (const auto& s : series)
    for (double v : s.y)
      if (std::isfinite(v) && v > 0)
        lo = std::min(lo, v), hi = std::max(hi, v);
      else if (std::isfinite(v))
        return false;  // zero or negative: no log axis
  return hi > 0 && hi / lo > ratio;
}

Panel chart_panel(const std::string& id, LineChart c, const std::string& caption = "") {
  return {id, c.title, caption, render_line_chart(c), false};
}

void loss_panels(const RunHistory& h, const std::vector<EventMarker>& ev, std::vector<Panel>& out) {
  LineChart c;
  c.title = "Loss";
  c.y_label = "cross-entropy";
  c.events = ev;
  if (const Series* s = h.find("moetron_loss")) c.series.push_back(line_of(*s, "train loss"));
  if (const Series* s = h.find("moetron_validation_loss")) {
    c.series.push_back(line_of(*s, "validation loss"));
    c.series.back().dots = true;
  }
  for (const auto& [task, s] : by_label(h, "moetron_task_loss", "task"))
    c.series.push_back(line_of(*s, "task " + task));
  if (!c.series.empty()) {
    c.log_y = wide_range(c.series, 3.0);
    out.push_back(chart_panel("loss", c));
  }
  LineChart b;
  b.title = "Balancing losses";
  b.y_label = "loss";
  b.events = ev;
  if (const Series* s = h.find("moetron_aux_loss"))
    b.series.push_back(line_of(*s, "aux (load balance)"));
  if (const Series* s = h.find("moetron_z_loss")) b.series.push_back(line_of(*s, "router z"));
  if (!b.series.empty()) out.push_back(chart_panel("balancing_losses", b));
}

void simple_panel(const RunHistory& h, const std::vector<EventMarker>& ev, const std::string& key,
                  const std::string& id, const std::string& title, const std::string& y_label,
                  std::vector<Panel>& out, double scale = 1.0) {
  const Series* s = h.find(key);
  if (!s) return;
  LineChart c;
  c.title = title;
  c.y_label = y_label;
  c.events = ev;
  c.series.push_back(line_of(*s, title, scale));
  c.log_y = id == "grad_norm" && wide_range(c.series, 20.0);
  out.push_back(chart_panel(id, c));
}

// Per layer: the norm over its matrix groups (sqrt of the sum of squares).
void layer_grad_panel(const RunHistory& h, const std::vector<EventMarker>& ev,
                      std::vector<Panel>& out) {
  std::map<std::string, std::map<double, double>,
           std::function<bool(const std::string&, const std::string&)>>
      sq(label_less);
  for (const auto& [key, s] : h.named("moetron_param_grad_norm"))
    for (size_t i = 0; i < s->steps.size(); ++i)
      if (std::isfinite(s->values[i]))
        sq[key.label("layer")][s->steps[i]] += s->values[i] * s->values[i];
  if (sq.empty()) return;
  LineChart c;
  c.title = "Gradient norm per layer";
  c.y_label = "L2 norm";
  c.events = ev;
  for (const auto& [layer, pts] : sq) {
    LineSeries l;
    l.name = "layer " + layer;
    for (const auto& [step, v] : pts) l.x.push_back(step), l.y.push_back(std::sqrt(v));
    c.series.push_back(l);
  }
  c.log_y = wide_range(c.series, 20.0);
  out.push_back(chart_panel("grad_norm_per_layer", c, "Norm over each layer's matrix groups."));
}

// Step time, stacked by phase; "other" is the step time the phases leave.
void step_time_panel(const RunHistory& h, const std::vector<EventMarker>& ev,
                     std::vector<Panel>& out) {
  Series step_storage;
  const Series* step = gauge_or_mean(h, "moetron_step_seconds", step_storage);
  std::map<std::string, Series> phase_storage;
  std::vector<std::pair<std::string, const Series*>> phases;
  for (const auto& [key, s] : h.named("moetron_phase_seconds"))
    phases.emplace_back(key.label("phase"), s);
  if (phases.empty())
    for (const auto& [key, s] : h.named("moetron_phase_seconds_sum")) {
      const std::string k = series_key("moetron_phase_seconds", key.labels);
      if (gauge_or_mean(h, k, phase_storage[k]))
        phases.emplace_back(key.label("phase"), &phase_storage[k]);
    }
  if (!step && phases.empty()) return;
  // In the order a step runs them; unknown phases after.
  const std::vector<std::string> order = {"data",         "forward",   "backward",  "pipeline_wait",
                                          "comm_exposed", "optimizer", "checkpoint"};
  const auto pos = [&](const std::string& p) {
    return std::find(order.begin(), order.end(), p) - order.begin();
  };
  std::stable_sort(phases.begin(), phases.end(),
                   [&](const auto& a, const auto& b) { return pos(a.first) < pos(b.first); });
  const std::vector<double>& x = step ? step->steps : h.steps;
  LineChart c;
  c.title = phases.empty() ? "Step time" : "Step time by phase";
  c.y_label = "seconds";
  c.events = ev;
  c.stacked = !phases.empty();
  std::vector<double> rest = step ? step->values : std::vector<double>(x.size(), NAN);
  for (const auto& [phase, s] : phases) {
    LineSeries l;
    l.name = phase;
    l.x = x;
    l.y = values_at(*s, x);
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isfinite(l.y[i])) rest[i] -= l.y[i];
    c.series.push_back(l);
  }
  if (step) {
    LineSeries l;
    l.name = phases.empty() ? "step" : "other";
    l.x = x;
    l.y = rest;
    c.series.push_back(l);
  }
  out.push_back(chart_panel("step_time", c,
                            phases.empty() ? ""
                                           : "Phases stacked; \"other\": the step time no "
                                             "phase accounts for."));
}

void memory_panel(const RunHistory& h, const std::vector<EventMarker>& ev,
                  std::vector<Panel>& out) {
  const LabelMap cur = by_label(h, "moetron_memory_bytes", "tag"),
                 peak = by_label(h, "moetron_memory_peak_bytes", "tag");
  if (cur.empty() && peak.empty()) return;
  std::vector<std::string> tags;
  for (const auto& m : {cur, peak})
    for (const auto& [tag, s] : m)
      if (std::find(tags.begin(), tags.end(), tag) == tags.end()) tags.push_back(tag);
  LineChart c;
  c.title = "Memory per allocator tag";
  c.y_label = "bytes";
  c.events = ev;
  for (size_t i = 0; i < tags.size(); ++i) {
    if (cur.count(tags[i])) c.series.push_back(line_of(*cur.at(tags[i]), tags[i]));
    if (cur.count(tags[i])) c.series.back().color = palette_color(i);
    if (peak.count(tags[i])) {
      c.series.push_back(line_of(*peak.at(tags[i]), tags[i] + " peak"));
      c.series.back().color = palette_color(i);
      c.series.back().dashed = true;
    }
  }
  out.push_back(chart_panel("memory", c, "Solid: current bytes; dashed: peak."));
}

// Bytes or seconds per step per communication axis, summed over operations.
void comm_panel(const RunHistory& h, const std::vector<EventMarker>& ev, const std::string& name,
                const std::string& id, const std::string& title, const std::string& unit,
                std::vector<Panel>& out) {
  std::map<std::string, std::map<double, double>,
           std::function<bool(const std::string&, const std::string&)>>
      per_axis(label_less);
  for (const auto& [key, s] : h.named(name)) {
    const Series r = counter_rate(*s);
    for (size_t i = 0; i < r.steps.size(); ++i)
      if (std::isfinite(r.values[i])) per_axis[key.label("axis")][r.steps[i]] += r.values[i];
  }
  if (per_axis.empty()) return;
  LineChart c;
  c.title = title;
  c.y_label = unit + " per step";
  c.events = ev;
  for (const auto& [axis, pts] : per_axis) {
    LineSeries l;
    l.name = axis;
    for (const auto& [step, v] : pts) l.x.push_back(step), l.y.push_back(v);
    c.series.push_back(l);
  }
  out.push_back(chart_panel(id, c));
}

// Per-rank step times, each step a rank was named a straggler ringed.
void rank_panel(const RunHistory& h, const std::vector<EventMarker>& ev, std::vector<Panel>& out) {
  const LabelMap ranks = by_label(h, "moetron_rank_step_seconds", "rank");
  if (ranks.empty()) return;
  const LabelMap flags = by_label(h, "moetron_straggler", "rank");
  LineChart c;
  c.title = "Step time per rank";
  c.y_label = "seconds";
  c.events = ev;
  PointSet stragglers;
  stragglers.name = "straggler";
  for (const auto& [rank, s] : ranks) {
    c.series.push_back(line_of(*s, "rank " + rank));
    if (!flags.count(rank)) continue;
    const std::vector<double> f = values_at(*flags.at(rank), s->steps);
    for (size_t i = 0; i < f.size(); ++i)
      if (f[i] >= 1) stragglers.x.push_back(s->steps[i]), stragglers.y.push_back(s->values[i]);
  }
  if (!stragglers.x.empty()) c.points.push_back(stragglers);
  out.push_back(
      chart_panel("rank_step_time", c, "Ringed: steps where the rank was named a straggler."));
}

// One line per label value of a metric (pipeline stages' busy time).
void labeled_panel(const RunHistory& h, const std::vector<EventMarker>& ev, const std::string& name,
                   const std::string& label, const std::string& id, const std::string& title,
                   const std::string& y_label, std::vector<Panel>& out) {
  const LabelMap m = by_label(h, name, label);
  if (m.empty()) return;
  LineChart c;
  c.title = title;
  c.y_label = y_label;
  c.events = ev;
  for (const auto& [value, s] : m) c.series.push_back(line_of(*s, label + " " + value));
  out.push_back(chart_panel(id, c));
}

std::string layer_title(const std::string& layer) {
  if (layer.rfind("moe", 0) == 0) return "MoE layer " + layer.substr(3);
  return "layer " + layer;
}

// One heatmap per layer: experts by step, coloured by their share of the layer's routed tokens.
void expert_load_panels(const RunHistory& h, std::vector<Panel>& out) {
  std::map<std::string,
           std::map<std::string, const Series*,
                    std::function<bool(const std::string&, const std::string&)>>,
           std::function<bool(const std::string&, const std::string&)>>
      layers(label_less);
  double vmax = 0;
  for (const auto& [key, s] : h.named("moetron_expert_load_ratio")) {
    auto it = layers.try_emplace(key.label("layer"), label_less).first;
    it->second[key.label("expert")] = s;
    for (double v : s->values)
      if (std::isfinite(v)) vmax = std::max(vmax, v);
  }
  for (const auto& [layer, experts] : layers) {
    Heatmap m;
    m.title = "Expert load, " + layer_title(layer);
    m.y_label = "expert";
    m.value_label = "token share";
    for (const auto& [e, s] : experts)
      for (double x : s->steps) m.x.push_back(x);
    std::sort(m.x.begin(), m.x.end());
    m.x.erase(std::unique(m.x.begin(), m.x.end()), m.x.end());
    for (const auto& [e, s] : experts) {
      m.rows.push_back(e);
      m.values.push_back(values_at(*s, m.x));
    }
    m.vmin = 0;
    m.vmax = vmax > 0 ? vmax : 1;
    m.height = std::clamp(90 + 14 * static_cast<int>(experts.size()), 180, 460);
    const std::string id = "expert_load_layer_" + layer;
    out.push_back({id, m.title,
                   "Share of the layer's routed tokens per expert (uniform: " +
                       std::to_string(1.0 / static_cast<double>(experts.size())).substr(0, 5) +
                       ").",
                   render_heatmap(m), false});
  }
}

}  // namespace

bool label_less(const std::string& a, const std::string& b) {
  const auto rank = [](const std::string& s) { return s == "embed" ? 0 : s == "head" ? 2 : 1; };
  if (rank(a) != rank(b)) return rank(a) < rank(b);
  char* ea = nullptr;
  char* eb = nullptr;
  const double na = std::strtod(a.c_str(), &ea), nb = std::strtod(b.c_str(), &eb);
  const bool num_a = !a.empty() && *ea == '\0', num_b = !b.empty() && *eb == '\0';
  if (num_a && num_b) return na < nb;
  if (num_a != num_b) return num_a;
  // "moe2" before "moe10": compare the common prefix, then the numbers after it.
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i] &&
         !std::isdigit(static_cast<unsigned char>(a[i])))
    ++i;
  if (i > 0 && i < a.size() && i < b.size() && std::isdigit(static_cast<unsigned char>(a[i])) &&
      std::isdigit(static_cast<unsigned char>(b[i])))
    return label_less(a.substr(i), b.substr(i));
  return a < b;
}

Series counter_rate(const Series& s) {
  Series r;
  double prev = NAN, prev_step = NAN;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const double v = s.values[i];
    if (!std::isfinite(v)) continue;
    double d = v, span = 1;
    if (std::isfinite(prev)) {
      d = v >= prev ? v - prev : v;
      span = std::max(1.0, s.steps[i] - prev_step);
    }
    r.steps.push_back(s.steps[i]);
    r.values.push_back(d / span);
    prev = v;
    prev_step = s.steps[i];
  }
  return r;
}

std::vector<double> values_at(const Series& s, const std::vector<double>& steps) {
  std::vector<double> out(steps.size(), NAN);
  size_t j = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    while (j < s.steps.size() && s.steps[j] < steps[i]) ++j;
    if (j < s.steps.size() && s.steps[j] == steps[i]) out[i] = s.values[j];
  }
  return out;
}

std::vector<Panel> build_panels(const RunHistory& h) {
  const std::vector<EventMarker> ev = markers_of(h);
  std::vector<Panel> out;
  loss_panels(h, ev, out);
  simple_panel(h, ev, "moetron_learning_rate", "learning_rate", "Learning rate", "lr", out);
  simple_panel(h, ev, "moetron_grad_norm", "grad_norm", "Gradient norm (global)", "L2 norm", out);
  layer_grad_panel(h, ev, out);
  simple_panel(h, ev, "moetron_tokens_per_second", "tokens_per_second", "Throughput", "tokens/s",
               out);
  simple_panel(h, ev, "moetron_mfu_ratio", "mfu", "MFU", "% of peak FLOP/s", out, 100.0);
  step_time_panel(h, ev, out);
  memory_panel(h, ev, out);
  comm_panel(h, ev, "moetron_comm_bytes_total", "comm_bytes", "Communication volume per axis",
             "bytes", out);
  comm_panel(h, ev, "moetron_comm_seconds_total", "comm_seconds", "Communication time per axis",
             "seconds", out);
  rank_panel(h, ev, out);
  labeled_panel(h, ev, "moetron_stage_busy_seconds", "stage", "stage_busy",
                "Pipeline stages: time not waiting", "seconds", out);
  simple_panel(h, ev, "moetron_loss_scale", "loss_scale", "Loss scale (fp16)", "scale", out);
  expert_load_panels(h, out);
  return out;
}

}  // namespace moetron::monitor
