#include "moetron/nn/recompute.h"

#include <cmath>

#include "moetron/core/error.h"

namespace moetron::nn {

namespace {
template <typename... Args>
void rule(bool ok, const char* key, const Args&... why) {
  if (!ok) MOETRON_FAIL("invalid config: '", key, "': ", why...);
}
}  // namespace

const std::vector<std::string>& recompute_module_names() {
  static const std::vector<std::string> names = {"attn_core", "moe_act", "norm", "moe_dispatch"};
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
         "recompute.policy = \"custom\" needs at least one of attn_core, moe_act, norm, "
         "moe_dispatch");
    for (const auto& m : modules) {
      bool found = false;
      for (size_t i = 0; i < names.size(); ++i) {
        if (m == names[i]) {
          p.modules |= 1u << i;
          found = true;
        }
      }
      rule(found, "recompute.modules", "unknown module \"", m,
           "\" (expected attn_core, moe_act, norm or moe_dispatch)");
    }
  } else {
    rule(modules.empty(), "recompute.modules",
         "used only with recompute.policy = \"custom\" (policy is \"", policy, "\")");
    if (policy == "selective") {
      p.modules = (1u << names.size()) - 1;
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
