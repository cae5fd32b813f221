#include "util/synthetic_run.h"

#include <cmath>
#include <string>

#include "moetron/monitor/json_series.h"

namespace moetron::test {

using monitor::MetricKind;

namespace {
const char* kPhases[] = {"forward", "backward", "optimizer", "data", "comm_exposed"};
const char* kTags[] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
const char* kAxes[] = {"dp", "ep"};
}  // namespace

SyntheticRun::SyntheticRun(int layers, int experts, int ranks)
    : layers_(layers), experts_(experts), ranks_(ranks) {
  define("moetron_loss", MetricKind::gauge, "");
  define("moetron_validation_loss", MetricKind::gauge, "");
  define("moetron_learning_rate", MetricKind::gauge, "");
  define("moetron_grad_norm", MetricKind::gauge, "");
  define("moetron_param_grad_norm", MetricKind::gauge, "", {"layer", "group"});
  define("moetron_tokens_per_second", MetricKind::gauge, "tokens");
  define("moetron_mfu_ratio", MetricKind::gauge, "ratio");
  define("moetron_step_seconds", MetricKind::gauge, "seconds");
  define("moetron_phase_seconds", MetricKind::gauge, "seconds", {"phase"});
  define("moetron_memory_bytes", MetricKind::gauge, "bytes", {"tag"});
  define("moetron_memory_peak_bytes", MetricKind::gauge, "bytes", {"tag"});
  define("moetron_expert_load_ratio", MetricKind::gauge, "ratio", {"layer", "expert"});
  define("moetron_router_entropy", MetricKind::gauge, "", {"layer"});
  define("moetron_aux_loss", MetricKind::gauge, "");
  define("moetron_comm_bytes_total", MetricKind::counter, "bytes", {"axis", "op"});
  define("moetron_comm_seconds_total", MetricKind::counter, "seconds", {"axis", "op"});
  define("moetron_rank_step_seconds", MetricKind::gauge, "seconds", {"rank"});
  define("moetron_straggler", MetricKind::gauge, "", {"rank"});
}

monitor::Metric& SyntheticRun::define(const std::string& name, MetricKind kind,
                                      const std::string& unit, std::vector<std::string> labels) {
  monitor::MetricDef d;
  d.name = name;
  d.kind = kind;
  d.unit = unit;
  d.help = "synthetic " + name;
  d.labels = std::move(labels);
  return registry_.define(std::move(d));
}

nlohmann::json SyntheticRun::advance(int64_t step) {
  monitor::Registry& r = registry_;
  const double s = static_cast<double>(step);
  const double loss = 1.5 + 4.0 * std::exp(-s / 40.0) + 0.05 * std::sin(s);
  const double lr = 3e-4 * std::min(1.0, s / 20.0);
  const double tps = 12000 + 800 * std::sin(s / 7.0);
  r.get("moetron_loss").set(loss);
  if (step % 10 == 0) r.get("moetron_validation_loss").set(loss + 0.1);
  r.get("moetron_learning_rate").set(lr);
  double sq = 0;
  for (int l = 0; l < layers_; ++l) {
    for (const char* g : {"attention", "experts"}) {
      const double v = (1.0 + l) * 0.3 * std::exp(-s / 60.0) + 0.05;
      r.get("moetron_param_grad_norm").set({std::to_string(l), g}, v);
      sq += v * v;
    }
    r.get("moetron_router_entropy").set({std::to_string(l)}, 2.0 - 0.3 * std::exp(-s / 30.0));
    for (int e = 0; e < experts_; ++e) {
      const double skew = 1.0 + 0.8 * std::sin(0.7 * e + 0.3 * l) * std::exp(-s / 50.0);
      r.get("moetron_expert_load_ratio")
          .set({std::to_string(l), std::to_string(e)}, skew / experts_);
    }
  }
  r.get("moetron_grad_norm").set(std::sqrt(sq));
  r.get("moetron_tokens_per_second").set(tps);
  r.get("moetron_mfu_ratio").set(tps / 40000.0);
  double step_s = 0;
  for (const char* p : kPhases) {
    const double v = p == std::string("backward") ? 0.2 : 0.08;
    r.get("moetron_phase_seconds").set({p}, v);
    step_s += v;
  }
  r.get("moetron_step_seconds").set(step_s);
  for (size_t i = 0; i < std::size(kTags); ++i) {
    const double bytes = (i + 1) * 8.0 * (1 << 20) * (i == 3 ? 1.0 + 0.1 * std::sin(s) : 1.0);
    r.get("moetron_memory_bytes").set({kTags[i]}, bytes);
    r.get("moetron_memory_peak_bytes").set({kTags[i]}, bytes * 1.25);
  }
  for (const char* axis : kAxes) {
    const std::string op = axis == std::string("ep") ? "all_to_all" : "allreduce";
    r.get("moetron_comm_bytes_total").add({axis, op}, axis == std::string("ep") ? 3e6 : 8e6);
    r.get("moetron_comm_seconds_total").add({axis, op}, 0.01);
  }
  for (int k = 0; k < ranks_; ++k) {
    const bool slow = k == 2 && step >= 30;
    r.get("moetron_rank_step_seconds")
        .set({std::to_string(k)}, step_s * (slow ? 1.6 : 1.0 + 0.02 * k));
    r.get("moetron_straggler").set({std::to_string(k)}, slow ? 1 : 0);
  }
  r.get("moetron_aux_loss").set(0.01 + 0.002 * std::exp(-s / 30.0));

  nlohmann::json line = {{"step", step},        {"loss", loss},     {"lr", lr},
                         {"tokens_per_s", tps}, {"step_s", step_s}, {"time", 1.7e9 + s}};
  line["series"] = monitor::json_series(r.snapshot());
  return line;
}

}  // namespace moetron::test
