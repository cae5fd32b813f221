#include "moetron/monitor/run_summary.h"

#include <toml++/toml.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "moetron/monitor/plot_ticks.h"

namespace moetron::monitor {

namespace fs = std::filesystem;

namespace {

std::string fmt(double v, int digits = 4) {
  return format_number(v, digits);
}

std::string step_str(double s) {
  return std::to_string(static_cast<int64_t>(s));
}

std::string duration(double s) {
  if (!std::isfinite(s)) return "-";
  char buf[64];
  if (s < 120) {
    std::snprintf(buf, sizeof(buf), "%.1f s", s);
  } else {
    const auto t = static_cast<int64_t>(std::lround(s));
    std::snprintf(buf, sizeof(buf), "%lldh %02lldm %02llds", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  }
  return buf;
}

// The newest complete checkpoint directory (one with its manifest), or "".
std::string latest_checkpoint_dir(const std::string& run_dir) {
  std::error_code ec;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  int64_t best = -1;
  std::string out;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& d : fs::directory_iterator(dir, ec)) {
    const std::string n = d.path().filename().string();
    if (n.rfind("step-", 0) != 0 || !fs::exists(d.path() / "manifest.json")) continue;
    const int64_t step = std::strtoll(n.c_str() + 5, nullptr, 10);
    if (step > best) best = step, out = d.path().string();
  }
  return out;
}

// "dp 2, tp 1, pp 1, ep 2" from an object with (some of) those keys.
std::string layout_of(const nlohmann::json& j) {
  std::string s;
  for (const char* k : {"world", "dp", "tp", "pp", "vpp", "ep", "cp", "zero"}) {
    if (!j.is_object() || !j.contains(k) || j[k].is_object() || j[k].is_array()) continue;
    s += (s.empty() ? "" : ", ") + std::string(k) + " " +
         (j[k].is_string() ? j[k].get<std::string>() : j[k].dump());
  }
  return s;
}

std::string layout_from(const RunHistory& h, const std::string& ckpt) {
  for (const auto& e : h.events) {
    if (e.kind != "start" || !e.fields.is_object()) continue;
    for (const char* k : {"layout", "plan"})
      if (e.fields.contains(k) && !layout_of(e.fields[k]).empty()) return layout_of(e.fields[k]);
    if (!layout_of(e.fields).empty()) return layout_of(e.fields);
  }
  if (ckpt.empty()) return "";
  std::ifstream f(ckpt + "/manifest.json");
  const auto m = nlohmann::json::parse(f, nullptr, false);
  if (m.is_discarded() || !m.is_object()) return "";
  // The manifest keeps what the saver passed under "state".
  const nlohmann::json& st = m.contains("state") ? m["state"] : m;
  if (!st.is_object() || !st.contains("layout")) return "";
  const std::string s = layout_of(st["layout"]);
  return s.empty() ? "" : s + " (checkpoint " + fs::path(ckpt).filename().string() + ")";
}

// The model's shape from the checkpoint's copy of the run's config.
std::string model_from(const std::string& ckpt) {
  if (ckpt.empty() || !fs::exists(ckpt + "/moetron.toml")) return "";
  toml::table t;
  try {
    t = toml::parse_file(ckpt + "/moetron.toml");
  } catch (const toml::parse_error&) {
    return "";
  }
  const auto i = [&](const char* path) { return t.at_path(path).value<int64_t>(); };
  std::string s;
  if (auto v = i("model.n_layers")) s += std::to_string(*v) + " layers";
  if (auto v = i("model.d_model")) s += ", d_model " + std::to_string(*v);
  if (auto v = i("moe.num_experts")) s += ", " + std::to_string(*v) + " experts";
  if (auto v = i("moe.top_k")) s += " top-" + std::to_string(*v);
  if (auto v = t.at_path("train.precision").value<std::string>()) s += ", " + *v;
  if (auto v = i("train.steps")) s += "; train.steps " + std::to_string(*v);
  return s;
}

void loss_stats(const RunHistory& h, RunSummary& r) {
  if (const Series* s = h.find("moetron_loss")) {
    for (size_t i = 0; i < s->values.size(); ++i) {
      const double v = s->values[i];
      if (!std::isfinite(v)) continue;
      if (std::isnan(r.first_loss)) r.first_loss = v;
      r.last_loss = v;
      if (std::isnan(r.min_loss) || v < r.min_loss) r.min_loss = v, r.min_loss_step = s->steps[i];
    }
  }
  if (const Series* s = h.find("moetron_validation_loss")) {
    for (size_t i = s->values.size(); i-- > 0;)
      if (std::isfinite(s->values[i])) {
        r.last_val_loss = s->values[i], r.last_val_step = s->steps[i];
        break;
      }
  }
}

void count_events(const RunHistory& h, RunSummary& r) {
  int64_t skipped_events = 0;
  for (const auto& e : h.events) {
    if (e.kind == "checkpoint") ++r.checkpoints, r.checkpoints_from_disk = e.derived;
    if (e.kind == "resume" || e.kind == "restart") ++r.restarts;
    if (e.kind == "skipped_step") ++skipped_events;
  }
  r.skipped_steps = skipped_events;
  if (const Series* s = h.find("moetron_step_skipped"))
    r.skipped_steps = std::count(s->values.begin(), s->values.end(), 1.0);
  else if (const Series* c = h.find("moetron_skipped_steps_total"); c && std::isfinite(c->last()))
    r.skipped_steps = static_cast<int64_t>(c->last());
}

void wall_time(const RunHistory& h, RunSummary& r) {
  double t0 = NAN, t1 = NAN;
  for (double t : h.times)
    if (std::isfinite(t)) t0 = std::isnan(t0) ? t : t0, t1 = t;
  const Series* step = h.find("moetron_step_seconds");
  if (std::isfinite(t0)) {
    // "time" is when a step ended: add the first step's own time.
    const double first = step && std::isfinite(step->values.front()) ? step->values.front() : 0.0;
    r.wall_s = t1 - t0 + first;
    return;
  }
  if (!step) return;
  r.wall_s = 0;
  for (double v : step->values)
    if (std::isfinite(v)) r.wall_s += v;
  r.wall_from_step_times = true;
}

void fill_rows(const RunHistory& h, RunSummary& r) {
  auto& rows = r.rows;
  std::string steps = std::to_string(r.steps);
  if (r.steps > 0)
    steps += " (steps " + step_str(r.first_step) + " to " + step_str(r.last_step) + ")";
  if (h.truncated_tail) steps += "; last line partial: the run is still writing";
  rows.emplace_back("Steps", steps);
  rows.emplace_back("Loss, first / last", fmt(r.first_loss) + " / " + fmt(r.last_loss));
  rows.emplace_back(
      "Loss, min",
      std::isnan(r.min_loss) ? "-" : fmt(r.min_loss) + " (step " + step_str(r.min_loss_step) + ")");
  rows.emplace_back("Validation loss, last",
                    std::isnan(r.last_val_loss)
                        ? "-"
                        : fmt(r.last_val_loss) + " (step " + step_str(r.last_val_step) + ")");
  rows.emplace_back("Tokens/s, median", fmt(r.median_tokens_per_s, 4));
  rows.emplace_back("MFU, median",
                    std::isnan(r.median_mfu) ? "-" : fmt(100 * r.median_mfu, 3) + " %");
  rows.emplace_back("Step time, median",
                    std::isnan(r.median_step_s) ? "-" : fmt(r.median_step_s, 3) + " s");
  rows.emplace_back("Skipped steps", std::to_string(r.skipped_steps));
  rows.emplace_back("Checkpoints", std::to_string(r.checkpoints) +
                                       (r.checkpoints_from_disk ? " on disk" : " written"));
  rows.emplace_back("Restarts", std::to_string(r.restarts));
  rows.emplace_back("Wall time",
                    duration(r.wall_s) + (r.wall_from_step_times ? " (sum of step times)" : ""));
  rows.emplace_back("Layout", r.layout.empty() ? "unknown" : r.layout);
  if (!r.model.empty()) rows.emplace_back("Model", r.model);
}

}  // namespace

double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return NAN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

RunSummary summarize(const RunHistory& h) {
  RunSummary r;
  r.steps = static_cast<int64_t>(h.steps.size());
  if (!h.steps.empty()) r.first_step = h.steps.front(), r.last_step = h.steps.back();
  loss_stats(h, r);
  const auto med = [&](const char* key) {
    const Series* s = h.find(key);
    return s ? median(s->values) : NAN;
  };
  r.median_tokens_per_s = med("moetron_tokens_per_second");
  r.median_mfu = med("moetron_mfu_ratio");
  r.median_step_s = med("moetron_step_seconds");
  count_events(h, r);
  wall_time(h, r);
  const std::string ckpt = latest_checkpoint_dir(h.run_dir);
  r.layout = layout_from(h, ckpt);
  r.model = model_from(ckpt);
  fill_rows(h, r);
  return r;
}

}  // namespace moetron::monitor
