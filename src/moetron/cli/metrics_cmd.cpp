#include "moetron/cli/metrics_cmd.h"

#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/monitor/metric_registry.h"
#include "moetron/train/training_metrics.h"

namespace moetron::cli {

CLI::App* add_metrics_command(CLI::App& app, MetricsCommand& o) {
  auto* cmd = app.add_subcommand("metrics", "describe the metrics a training run exports");
  cmd->add_flag("--list", o.list, "list every metric: name, kind, unit, labels, help");
  cmd->add_flag("--json", o.json, "as JSON instead of a table");
  return cmd;
}

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

int run_metrics_command(const MetricsCommand& o) {
  MOETRON_CHECK(o.list, "moetron metrics: nothing to do (try --list)");
  monitor::Registry registry;
  train::define_training_metrics(registry);
  const std::vector<const monitor::MetricDef*> defs = registry.definitions();
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const monitor::MetricDef* d : defs) {
      j.push_back({{"name", d->name},
                   {"kind", monitor::name_of(d->kind)},
                   {"unit", d->unit},
                   {"labels", d->labels},
                   {"help", d->help}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << std::left << std::setw(38) << "metric" << std::setw(11) << "kind" << std::setw(10)
            << "unit" << std::setw(22) << "labels"
            << "help\n";
  for (const monitor::MetricDef* d : defs) {
    std::cout << std::setw(38) << d->name << std::setw(11) << monitor::name_of(d->kind)
              << std::setw(10) << d->unit << std::setw(22) << joined(d->labels) << d->help << "\n";
  }
  std::cout << defs.size() << " metrics; labelled ones have one series per label value "
            << "(layers, experts, ranks, ...)\n";
  return 0;
}

}  // namespace moetron::cli
