#include "moetron/nn/recompute.h"

#include <atomic>
#include <cmath>

#include "moetron/core/error.h"

namespace moetron::nn {

namespace {
template <typename... Args>
void rule(bool ok, const char* key, const Args&... why) {
  if (!ok) MOETRON_FAIL("invalid config: '", key, "': ", why...);
}
// What selective drops: the modules ranked first by activation bytes saved
// per FLOP (and per second) recomputed, measured one by one
// (bench/RESULTS.md, "Selective recompute by bytes saved per FLOP"), up to
// half of none's activations: the memory-bound rebuilds and the expert
// outputs, then the q, k, v projections (D-deep GEMMs). The attention core
// (S-deep: 4x dearer per byte at S 2048) and the residual (whose o_proj
// rebuild saves less than it costs) stay.
constexpr uint32_t kSelectiveModules =
    static_cast<uint32_t>(Recompute::moe_act) | static_cast<uint32_t>(Recompute::norm) |
    static_cast<uint32_t>(Recompute::moe_dispatch) | static_cast<uint32_t>(Recompute::moe_out) |
    static_cast<uint32_t>(Recompute::attn_q) | static_cast<uint32_t>(Recompute::attn_kv);

std::string module_list() {
  std::string s;
  for (const auto& n : recompute_module_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

const std::vector<std::string>& recompute_module_names() {
  static const std::vector<std::string> names = {"attn_core",    "moe_act",      "norm",
                                                 "moe_dispatch", "moe_out",      "attn_q",
                                                 "attn_kv",      "attn_residual"};
  return names;
}

RecomputePolicy make_recompute_policy(const std::string& policy,
                                      const std::vector<std::string>& modules, int64_t n_layers,
                                      int64_t segment) {
  rule(n_layers > 0, "model.n_layers", "must be positive");
  rule(segment >= 0, "recompute.segment", "must be >= 0 (0: ceil(sqrt(L)))");
  RecomputePolicy p;
  p.name = policy;
  const auto& names = recompute_module_names();
  if (policy == "custom") {
    rule(!modules.empty(), "recompute.modules",
         "recompute.policy = \"custom\" needs at least one of ", module_list());
    for (const auto& m : modules) {
      bool found = false;
      for (size_t i = 0; i < names.size(); ++i) {
        if (m == names[i]) {
          p.modules |= 1u << i;
          found = true;
        }
      }
      rule(found, "recompute.modules", "unknown module \"", m, "\" (expected one of ",
           module_list(), ")");
    }
  } else {
    rule(modules.empty(), "recompute.modules",
         "used only with recompute.policy = \"custom\" (policy is \"", policy, "\")");
    if (policy == "selective") {
      p.modules = kSelectiveModules;
    } else if (policy == "full") {
      p.segment = 1;
    } else if (policy == "sqrt") {
      p.segment = segment > 0
                      ? segment
                      : static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n_layers))));
    } else {
      rule(policy == "none", "recompute.policy",
           "must be none, selective, full, sqrt or custom, got \"", policy, "\"");
    }
  }
  rule(segment == 0 || policy == "sqrt", "recompute.segment",
       "used only with recompute.policy = \"sqrt\"");
  if (p.segment > n_layers) p.segment = n_layers;
  return p;
}

namespace {
std::atomic<int64_t> recompute_ns{0};
thread_local int timer_depth = 0;
}  // namespace

double recompute_seconds() {
  return static_cast<double>(recompute_ns.load()) * 1e-9;
}
void reset_recompute_seconds() {
  recompute_ns = 0;
}

RecomputeTimer::RecomputeTimer()
    : start_(std::chrono::steady_clock::now()), outer_(timer_depth++ == 0) {}

RecomputeTimer::~RecomputeTimer() {
  --timer_depth;
  if (!outer_) return;
  recompute_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
}

std::string describe(const RecomputePolicy& p) {
  if (p.segment > 0)
    return str_cat(p.name, " (segments of ", p.segment, p.segment == 1 ? " block)" : " blocks)");
  if (p.modules == 0 || p.name == "selective") return p.name;
  std::string s = p.name + " [";
  bool first = true;
  const auto& names = recompute_module_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (p.modules & (1u << i)) {
      s += (first ? "" : ", ") + names[i];
      first = false;
    }
  }
  return s + "]";
}

}  // namespace moetron::nn
