// `moetron report`: a self-contained HTML report of a run (summary table,
// charts inlined as SVG, events) and each chart as its own .svg file, from
// RUN_DIR/metrics.jsonl and RUN_DIR/events.jsonl. Works on a running run
// (a partial last line is skipped). Every file is written whole under a
// temporary name and renamed, so a failure never leaves a partial report.
#pragma once

#include <string>
#include <vector>

#include "moetron/monitor/report_panels.h"
#include "moetron/monitor/run_history.h"
#include "moetron/monitor/run_summary.h"

namespace moetron::monitor {

struct ReportOptions {
  std::string run_dir;
  std::string out_html;  // empty: RUN_DIR/report.html
  std::string svg_dir;   // empty: RUN_DIR/report
};

struct ReportResult {
  std::string html_path, svg_dir;
  std::vector<std::string> svg_files;
  RunSummary summary;
};

ReportResult write_run_report(const ReportOptions& opts);

// The HTML page (no scripts, nothing fetched: styles and SVGs inline).
std::string render_report_html(const RunHistory& h, const RunSummary& s,
                               const std::vector<Panel>& panels);

}  // namespace moetron::monitor
