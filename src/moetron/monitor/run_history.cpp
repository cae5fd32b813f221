#include "moetron/monitor/run_history.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"

namespace moetron::monitor {

namespace fs = std::filesystem;

namespace {

// Top-level keys of a metrics line and the series the monitor writes for them.
const std::vector<std::pair<const char*, const char*>>& plain_keys() {
  static const std::vector<std::pair<const char*, const char*>> keys = {
      {"loss", "moetron_loss"},
      {"val_loss", "moetron_validation_loss"},
      {"lr", "moetron_learning_rate"},
      {"grad_norm", "moetron_grad_norm"},
      {"tokens_per_s", "moetron_tokens_per_second"},
      {"mfu", "moetron_mfu_ratio"},
      {"aux_loss", "moetron_aux_loss"},
      {"z_loss", "moetron_z_loss"},
      {"step_s", "moetron_step_seconds"},
      {"loss_scale", "moetron_loss_scale"},
      // Per step, not counters: the report's own names.
      {"skipped", "moetron_step_skipped"},
      {"tokens", "moetron_step_tokens"},
      {"dropped_slots", "moetron_step_dropped_slots"}};
  return keys;
}

double number_of(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  return NAN;  // null (a NaN written by nlohmann::json), strings, arrays
}

void put(RunHistory& h, const std::string& key, double step, double value) {
  Series& s = h.series[key];
  s.steps.push_back(step);
  s.values.push_back(value);
}

// A step written again: the run resumed from an earlier checkpoint, and
// what the abandoned attempt wrote from `step` on is dropped.
void drop_from(RunHistory& h, double step) {
  const auto cut = [step](std::vector<double>& steps, std::vector<double>& values) {
    const size_t n =
        static_cast<size_t>(std::lower_bound(steps.begin(), steps.end(), step) - steps.begin());
    steps.resize(n);
    values.resize(n);
  };
  for (auto& [key, s] : h.series) cut(s.steps, s.values);
  cut(h.steps, h.times);
}

// The top-level keys of runs made before the monitor (and still written).
void put_plain_keys(const nlohmann::json& j, double step, const std::set<std::string>& in_series,
                    RunHistory& h) {
  const auto absent = [&](const char* name) { return in_series.count(name) == 0; };
  for (const auto& [key, name] : plain_keys())
    if (j.contains(key) && absent(name)) put(h, name, step, number_of(j[key]));
  if (absent("moetron_phase_seconds")) {
    if (j.contains("pipeline_wait_s"))
      put(h, series_key("moetron_phase_seconds", {{"phase", "pipeline_wait"}}), step,
          number_of(j["pipeline_wait_s"]));
    if (j.contains("comm_wait_s"))
      put(h, series_key("moetron_phase_seconds", {{"phase", "comm_exposed"}}), step,
          number_of(j["comm_wait_s"]));
  }
  if (j.contains("stage_busy_s") && j["stage_busy_s"].is_array()) {
    const auto& a = j["stage_busy_s"];
    for (size_t i = 0; i < a.size(); ++i)
      put(h, series_key("moetron_stage_busy_seconds", {{"stage", std::to_string(i)}}), step,
          number_of(a[i]));
  }
  if (j.contains("grad_bytes_sent") && absent("moetron_comm_bytes_total")) {
    // Bytes of this step: kept as the counter the monitor exports.
    const std::string key =
        series_key("moetron_comm_bytes_total", {{"axis", "dp"}, {"op", "gradients"}});
    const double before = h.series.count(key) ? h.series[key].last() : 0.0;
    put(h, key, step, (std::isfinite(before) ? before : 0.0) + number_of(j["grad_bytes_sent"]));
  }
  if (j.contains("expert_load") && j["expert_load"].is_array() &&
      absent("moetron_expert_load_ratio")) {
    const auto& layers = j["expert_load"];
    for (size_t l = 0; l < layers.size(); ++l) {
      if (!layers[l].is_array()) continue;
      double total = 0;
      for (const auto& v : layers[l]) total += std::isfinite(number_of(v)) ? number_of(v) : 0.0;
      for (size_t e = 0; e < layers[l].size(); ++e) {
        const std::string key =
            series_key("moetron_expert_load_ratio",
                       {{"layer", "moe" + std::to_string(l)}, {"expert", std::to_string(e)}});
        put(h, key, step, total > 0 ? number_of(layers[l][e]) / total : NAN);
      }
    }
  }
}

// A series key as written -> its metric name and canonical key.
using KeyCache = std::unordered_map<std::string, std::pair<std::string, std::string>>;

void add_metrics_line(const nlohmann::json& j, const std::string& where, KeyCache& keys,
                      RunHistory& h) {
  MOETRON_CHECK(j.contains("step") && j["step"].is_number_integer(), where,
                ": a metrics line needs an integer \"step\"");
  const auto step = static_cast<double>(j["step"].get<int64_t>());
  if (!h.steps.empty() && step <= h.steps.back()) {
    RunEvent e;
    e.step = static_cast<int64_t>(step);
    e.kind = "resume";
    e.message = "steps from " + std::to_string(e.step) + " written again (resumed)";
    e.derived = true;
    h.events.push_back(e);
    drop_from(h, step);
  }
  h.steps.push_back(step);
  h.times.push_back(j.contains("time") ? number_of(j["time"]) : NAN);
  std::set<std::string> in_series;
  if (j.contains("series")) {
    MOETRON_CHECK(j["series"].is_object(), where, ": \"series\" must be an object");
    for (const auto& [k, v] : j["series"].items()) {
      // Every line repeats the same keys: each is parsed once.
      auto it = keys.find(k);
      if (it == keys.end()) {
        SeriesKey key;
        try {
          key = parse_series_key(k);
        } catch (const Error& e) {
          MOETRON_FAIL(where, ": ", e.what());
        }
        it = keys.emplace(k, std::make_pair(key.name, series_key(key.name, key.labels))).first;
      }
      in_series.insert(it->second.first);
      put(h, it->second.second, step, number_of(v));
    }
  }
  put_plain_keys(j, step, in_series, h);
  ++h.lines;
}

void add_event_line(const nlohmann::json& j, RunHistory& h) {
  RunEvent e;
  e.fields = j;
  if (j.contains("time")) e.time = number_of(j["time"]);
  if (j.contains("step") && j["step"].is_number_integer()) e.step = j["step"].get<int64_t>();
  e.kind = j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "event";
  if (j.contains("message") && j["message"].is_string())
    e.message = j["message"].get<std::string>();
  h.events.push_back(std::move(e));
}

// Calls fn(json, "file:line") for every complete line that is a JSON object.
// A last line without its newline that does not parse is being written:
// skipped (returns true); any other bad line is an error.
template <typename Fn>
bool for_each_json_line(std::istream& in, const std::string& name, Fn fn) {
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  size_t pos = 0;
  int64_t number = 0;
  bool truncated = false;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const bool last_partial = end == std::string::npos;
    if (last_partial) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = name + ":" + std::to_string(number);
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() && last_partial) {
      truncated = true;
      continue;
    }
    MOETRON_CHECK(!j.is_discarded(), where, ": not valid JSON: ", line.substr(0, 80));
    MOETRON_CHECK(j.is_object(), where, ": a line must be a JSON object");
    fn(j, where);
  }
  return truncated;
}

void derive_events(RunHistory& h) {
  std::set<std::string> kinds;
  for (const auto& e : h.events)
    if (!e.derived) kinds.insert(e.kind);
  if (kinds.count("resume") || kinds.count("restart"))
    std::erase_if(h.events, [](const RunEvent& e) { return e.derived && e.kind == "resume"; });
  if (!kinds.count("skipped_step")) {
    if (const Series* s = h.find("moetron_step_skipped")) {
      for (size_t i = 0; i < s->steps.size(); ++i) {
        if (s->values[i] != 1.0) continue;
        RunEvent e;
        e.step = static_cast<int64_t>(s->steps[i]);
        e.kind = "skipped_step";
        e.message = "step " + std::to_string(e.step) + " skipped";
        e.derived = true;
        h.events.push_back(e);
      }
    }
  }
  const fs::path ckpts = fs::path(h.run_dir) / "checkpoints";
  std::error_code ec;
  if (!kinds.count("checkpoint") && !h.run_dir.empty() && fs::is_directory(ckpts, ec)) {
    for (const auto& d : fs::directory_iterator(ckpts, ec)) {
      const std::string n = d.path().filename().string();
      if (n.rfind("step-", 0) != 0 || !fs::exists(d.path() / kManifestName)) continue;
      RunEvent e;
      e.step = std::strtoll(n.c_str() + 5, nullptr, 10);
      e.kind = "checkpoint";
      e.message = "checkpoint " + d.path().string();
      e.derived = true;
      h.events.push_back(e);
    }
  }
  std::stable_sort(h.events.begin(), h.events.end(),
                   [](const RunEvent& a, const RunEvent& b) { return a.step < b.step; });
}

}  // namespace

SeriesKey parse_series_key(const std::string& key) {
  SeriesKey k;
  const size_t brace = key.find('{');
  k.name = key.substr(0, brace);
  MOETRON_CHECK(!k.name.empty(), "series key '", key, "' has no metric name");
  if (brace == std::string::npos) return k;
  MOETRON_CHECK(key.back() == '}', "series key '", key, "' does not end with '}'");
  size_t i = brace + 1;
  while (i < key.size() - 1) {
    const size_t eq = key.find('=', i);
    MOETRON_CHECK(eq != std::string::npos && eq + 1 < key.size() && key[eq + 1] == '"',
                  "series key '", key, "': expected label=\"value\"");
    const std::string label = key.substr(i, eq - i);
    std::string value;
    size_t j = eq + 2;
    for (; j < key.size() && key[j] != '"'; ++j) {
      char c = key[j];
      if (c == '\\' && j + 1 < key.size()) {
        c = key[++j];
        if (c == 'n') c = '\n';
      }
      value += c;
    }
    MOETRON_CHECK(j < key.size(), "series key '", key, "': unterminated label value");
    k.labels[label] = value;
    i = j + 1;
    if (i < key.size() && key[i] == ',') ++i;
  }
  return k;
}

std::string series_key(const std::string& name, const std::map<std::string, std::string>& labels) {
  if (labels.empty()) return name;
  std::string s = name + "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    s += (first ? "" : ",") + k + "=\"";
    for (char c : v) {
      if (c == '\\' || c == '"') s += '\\';
      s += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    s += "\"";
    first = false;
  }
  return s + "}";
}

const Series* RunHistory::find(const std::string& key) const {
  const auto it = series.find(key);
  return it == series.end() || it->second.steps.empty() ? nullptr : &it->second;
}

std::vector<std::pair<SeriesKey, const Series*>> RunHistory::named(const std::string& name) const {
  std::vector<std::pair<SeriesKey, const Series*>> out;
  for (auto it = series.lower_bound(name); it != series.end(); ++it) {
    if (it->first.compare(0, name.size(), name) != 0) break;
    if (it->first.size() > name.size() && it->first[name.size()] != '{') continue;
    if (it->second.steps.empty()) continue;
    out.emplace_back(parse_series_key(it->first), &it->second);
  }
  return out;
}

void read_metrics(std::istream& in, const std::string& name, RunHistory& h) {
  KeyCache keys;
  h.truncated_tail =
      for_each_json_line(in, name, [&](const nlohmann::json& j, const std::string& where) {
        add_metrics_line(j, where, keys, h);
      });
}

void read_events(std::istream& in, const std::string& name, RunHistory& h) {
  for_each_json_line(in, name,
                     [&](const nlohmann::json& j, const std::string&) { add_event_line(j, h); });
}

RunHistory read_run_history(const std::string& run_dir) {
  RunHistory h;
  h.run_dir = run_dir;
  const std::string metrics = (fs::path(run_dir) / "metrics.jsonl").string();
  if (!fs::is_directory(run_dir)) MOETRON_FAIL("run directory '", run_dir, "' does not exist");
  std::ifstream m(metrics);
  if (!fs::exists(metrics) || !m.good()) {
    MOETRON_FAIL("no metrics file '", metrics,
                 "': not a moetron run directory, or its first step has not finished");
  }
  read_metrics(m, metrics, h);
  const std::string events = (fs::path(run_dir) / "events.jsonl").string();
  if (fs::exists(events)) {
    std::ifstream e(events);
    MOETRON_CHECK(e.good(), "cannot read '", events, "'");
    read_events(e, events, h);
  }
  derive_events(h);
  return h;
}

}  // namespace moetron::monitor
