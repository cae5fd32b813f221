#include "moetron/cli/report_cmd.h"

#include <iostream>

#include "moetron/monitor/run_report.h"

namespace moetron::cli {

CLI::App* add_report_command(CLI::App& app, ReportCommand& o) {
  auto* cmd = app.add_subcommand(
      "report", "write an HTML report with plots of a finished or running run's metrics");
  cmd->add_option("run_dir", o.run_dir, "run directory (holds metrics.jsonl)")->required();
  cmd->add_option("--out", o.out, "HTML file to write (default: RUN_DIR/report.html)");
  cmd->add_option("--svg-dir", o.svg_dir, "folder for one SVG per plot (default: RUN_DIR/report)");
  return cmd;
}

int run_report_command(const ReportCommand& o) {
  monitor::ReportOptions opts;
  opts.run_dir = o.run_dir;
  opts.out_html = o.out;
  opts.svg_dir = o.svg_dir;
  const monitor::ReportResult r = monitor::write_run_report(opts);
  std::cout << "wrote " << r.html_path << " (" << r.summary.steps << " steps, "
            << r.svg_files.size() << " plots; SVG files in " << r.svg_dir << ")\n";
  return 0;
}

}  // namespace moetron::cli
