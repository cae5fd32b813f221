// The live dashboard's files (HTML, CSS, JS and Debian's Chart.js), compiled
// into the binary at build time from src/moetron/monitor/dashboard/ and
// libjs-chart.js (cmake/embed_dashboard.cmake): nothing is fetched at run time.
#pragma once

#include <span>
#include <string_view>

namespace moetron::monitor {

struct DashboardAsset {
  std::string_view path;          // URL path, e.g. "/dashboard.js"; the page is "/"
  std::string_view content_type;  // e.g. "text/javascript; charset=utf-8"
  std::string_view body;
};

// Every asset, the page ("/") first. The views point at static storage.
std::span<const DashboardAsset> dashboard_assets();

}  // namespace moetron::monitor
