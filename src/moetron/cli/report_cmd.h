// `moetron report RUN_DIR`: the run's HTML report and its charts as SVG
// files (monitor/run_report.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace moetron::cli {

struct ReportCommand {
  std::string run_dir;
  std::string out;      // empty: RUN_DIR/report.html
  std::string svg_dir;  // empty: RUN_DIR/report
};

CLI::App* add_report_command(CLI::App& app, ReportCommand& opts);
int run_report_command(const ReportCommand& opts);

}  // namespace moetron::cli
