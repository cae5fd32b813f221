#include "moetron/monitor/run_report.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/monitor/svg_plot.h"

namespace moetron::monitor {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxEventRows = 200;

const char* kStyle = R"(<style>
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.meta { color: #666; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; background: #fff; }
td, th { border: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
.grid { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; background: #fff; border: 1px solid #e3e3e3; padding: 6px; }
figcaption { font-size: 12px; color: #555; max-width: 700px; padding: 2px 4px; }
svg { display: block; max-width: 100%; height: auto; }
</style>
)";

std::string esc(const std::string& s) {
  return xml_escape(s);
}

// A panel id as a file name: letters, digits, '-' and '_' kept.
std::string file_stem(const std::string& id) {
  std::string s = id;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return s;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string summary_table(const RunSummary& s) {
  std::string out = "<table class=\"summary\" id=\"summary\">\n";
  for (const auto& [label, value] : s.rows)
    out += "<tr><th>" + esc(label) + "</th><td>" + esc(value) + "</td></tr>\n";
  return out + "</table>\n";
}

std::string figures(const std::vector<Panel>& panels, bool heatmaps) {
  std::string out = "<div class=\"grid\">\n";
  for (const auto& p : panels) {
    if ((p.id.rfind("expert_load", 0) == 0) != heatmaps) continue;
    out += "<figure id=\"panel-" + esc(p.id) + "\">\n" + p.svg;
    if (!p.caption.empty()) out += "<figcaption>" + esc(p.caption) + "</figcaption>\n";
    out += "</figure>\n";
  }
  return out + "</div>\n";
}

std::string events_table(const RunHistory& h) {
  std::string out =
      "<table class=\"events\" "
      "id=\"events\">\n<tr><th>step</th><th>kind</th><th>message</th><th>source</th></tr>\n";
  size_t n = 0;
  for (const auto& e : h.events) {
    if (n++ == kMaxEventRows) {
      out += "<tr><td colspan=\"4\">" + std::to_string(h.events.size() - kMaxEventRows) +
             " more events</td></tr>\n";
      break;
    }
    out += "<tr><td>" + (e.step >= 0 ? std::to_string(e.step) : std::string("-")) + "</td><td>" +
           esc(e.kind) + "</td><td>" + esc(e.message) + "</td><td>" +
           (e.derived ? "inferred" : "events.jsonl") + "</td></tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace

std::string render_report_html(const RunHistory& h, const RunSummary& s,
                               const std::vector<Panel>& panels) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>moetron report: " + esc(h.run_dir) + "</title>\n" + kStyle + "</head>\n<body>\n";
  out += "<h1>moetron run report: <code>" + esc(h.run_dir) + "</code></h1>\n";
  out += "<p class=\"meta\">Generated " + utc_now() + " from metrics.jsonl (" +
         std::to_string(h.lines) + " lines)" + ". Vertical dashed lines on the charts are events " +
         "(hover for details).</p>\n";
  out += "<h2>Summary</h2>\n" + summary_table(s);
  out += "<h2>Training</h2>\n" + figures(panels, false);
  bool any_heatmap = false;
  for (const auto& p : panels) any_heatmap = any_heatmap || p.id.rfind("expert_load", 0) == 0;
  if (any_heatmap) out += "<h2>Expert load</h2>\n" + figures(panels, true);
  if (!h.events.empty()) out += "<h2>Events</h2>\n" + events_table(h);
  return out + "</body>\n</html>\n";
}

ReportResult write_run_report(const ReportOptions& o) {
  const RunHistory h = read_run_history(o.run_dir);
  ReportResult r;
  r.summary = summarize(h);
  const std::vector<Panel> panels = build_panels(h);
  r.html_path = o.out_html.empty() ? (fs::path(o.run_dir) / "report.html").string() : o.out_html;
  r.svg_dir = o.svg_dir.empty() ? (fs::path(o.run_dir) / "report").string() : o.svg_dir;
  std::error_code ec;
  fs::create_directories(r.svg_dir, ec);
  MOETRON_CHECK(fs::is_directory(r.svg_dir), "cannot create the SVG directory '", r.svg_dir,
                "': ", ec.message());
  const fs::path html_parent = fs::path(r.html_path).parent_path();
  if (!html_parent.empty()) fs::create_directories(html_parent, ec);
  for (const auto& p : panels) {
    const std::string file = (fs::path(r.svg_dir) / (file_stem(p.id) + ".svg")).string();
    write_file_atomically(file, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + p.svg);
    r.svg_files.push_back(file);
  }
  write_file_atomically(r.html_path, render_report_html(h, r.summary, panels));
  return r;
}

}  // namespace moetron::monitor
