// The charts of a run report, built from a RunHistory: each panel is drawn
// only when its series exist (a run before the monitor has loss, lr, grad
// norm, tokens/s, MFU, step time and expert load; the monitor's series add
// per-layer gradient norms, phases, memory, communication and ranks).
#pragma once

#include <string>
#include <vector>

#include "moetron/monitor/run_history.h"

namespace moetron::monitor {

struct Panel {
  std::string id;  // file name stem of its SVG: "loss", "expert_load_layer_3"
  std::string title, caption;
  std::string svg;
  bool wide = false;  // spans the page's full width
};

std::vector<Panel> build_panels(const RunHistory& h);

// Per-step increments of a counter (bytes or seconds per step): a counter
// that went down was restarted with its process, and its value is the
// increment; the first point's increment is its value.
Series counter_rate(const Series& s);

// Values of `s` at each of `steps` (both ascending); NaN where `s` has none.
std::vector<double> values_at(const Series& s, const std::vector<double>& steps);

// Orders label values numerically where both are numbers, "embed" first and
// "head" last (layer labels), else as strings.
bool label_less(const std::string& a, const std::string& b);

}  // namespace moetron::monitor
