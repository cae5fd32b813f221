// `moetron metrics --list`: every metric a training run defines, with its
// kind, unit, labels and help (train/training_metrics.h), as a table or JSON.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace moetron::cli {

struct MetricsCommand {
  bool list = false;
  bool json = false;
};

CLI::App* add_metrics_command(CLI::App& app, MetricsCommand& opts);
int run_metrics_command(const MetricsCommand& opts);

}  // namespace moetron::cli
