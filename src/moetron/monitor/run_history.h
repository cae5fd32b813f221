// A run's metrics and events read back from RUN_DIR/metrics.jsonl and
// RUN_DIR/events.jsonl (schema: the monitor's JSON lines sink) into typed
// series keyed by their Prometheus series key.
//
// Runs made before the monitor have only the top-level keys of a line
// (loss, lr, grad_norm, expert_load, ...); they are read as the series the
// monitor writes today (loss -> moetron_loss, expert_load[l][e] ->
// moetron_expert_load_ratio{layer="moe l",expert="e"}, ...), unless the
// line's "series" object already holds that metric. A step that comes again
// (a run resumed from an earlier checkpoint appends to the same file)
// replaces what the abandoned steps wrote, and is noted as a resume event.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moetron::monitor {

// One series over steps; values may be NaN (written as null).
struct Series {
  std::vector<double> steps, values;
  double last() const { return values.empty() ? NAN : values.back(); }
};

// A series key split into its metric name and labels:
// `moetron_phase_seconds{phase="forward"}` -> name, {phase: forward}.
struct SeriesKey {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string label(const std::string& k) const {
    const auto it = labels.find(k);
    return it == labels.end() ? "" : it->second;
  }
};
// Throws moetron::Error on a malformed key.
SeriesKey parse_series_key(const std::string& key);
// The canonical key: labels sorted by name, values escaped.
std::string series_key(const std::string& name,
                       const std::map<std::string, std::string>& labels = {});

struct RunEvent {
  double time = NAN;
  int64_t step = -1;
  std::string kind, message;
  nlohmann::json fields;  // the whole line
  bool derived = false;   // inferred from metrics or checkpoints, not read from events.jsonl
};

struct RunHistory {
  std::string run_dir;
  std::map<std::string, Series> series;  // by canonical key
  std::vector<double> steps;             // every step read, ascending
  std::vector<double> times;             // "time" of each step (NaN where absent)
  std::vector<RunEvent> events;          // by step
  int64_t lines = 0;                     // metric lines read
  bool truncated_tail = false;           // the last line was partial (a running run)

  const Series* find(const std::string& key) const;
  // Every series of a metric name, by key.
  std::vector<std::pair<SeriesKey, const Series*>> named(const std::string& name) const;
};

// Reads metrics.jsonl (required; an error names the path when missing) and
// events.jsonl (optional) of a run directory. A partial last line is
// skipped; any other line that is not a JSON object with an integer "step"
// is an error naming the file and line number. Skipped steps, resumes and
// the checkpoints on disk become derived events where events.jsonl does not
// have them.
RunHistory read_run_history(const std::string& run_dir);

// The parsing, from streams (`name` goes into error messages).
void read_metrics(std::istream& in, const std::string& name, RunHistory& h);
void read_events(std::istream& in, const std::string& name, RunHistory& h);

}  // namespace moetron::monitor
