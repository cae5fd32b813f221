#include "moetron/planner/hardware_profile.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"

namespace moetron::planner {

namespace {

double number(const toml::table& t, const std::string& key, const std::string& path) {
  const auto node = t.at_path(key);
  MOETRON_CHECK(node, "hardware profile '", path, "': missing '", key, "'");
  const std::optional<double> v = node.value<double>();
  MOETRON_CHECK(v.has_value() && *v > 0, "hardware profile '", path, "': '", key,
                "' must be a positive number");
  return *v;
}

// Every key of the file must be one the profile reads: a typo is an error,
// not a silently ignored setting.
void check_keys(const toml::table& t, const std::string& path) {
  static const std::map<std::string, std::set<std::string>> known = {
      {"device",
       {"peak_tflops", "gemm_efficiency", "gemm_half_rows", "grouped_gemm_efficiency",
        "attention_efficiency", "memory_gib", "memory_tbps", "elementwise_tbps",
        "devices_per_node"}},
      {"intra", {"bandwidth_gbps", "latency_us"}},
      {"inter", {"bandwidth_gbps", "latency_us"}},
      {"host", {"memory_gib", "memory_tbps", "pcie_gbps"}}};
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (key == "name" || key == "sources") continue;
    const auto it = known.find(key);
    MOETRON_CHECK(it != known.end() && v.is_table(), "hardware profile '", path,
                  "': unknown section '", key, "'");
    for (const auto& [sk, sv] : *v.as_table()) {
      MOETRON_CHECK(it->second.count(std::string(sk.str())) != 0, "hardware profile '", path,
                    "': unknown key '", key, ".", sk.str(), "'");
    }
  }
}

}  // namespace

HardwareProfile load_hardware_profile(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    MOETRON_FAIL("hardware profile '", path, "': ", e.description());
  }
  check_keys(t, path);
  HardwareProfile p;
  p.name = t["name"].value_or(std::filesystem::path(path).stem().string());
  p.peak_flops = number(t, "device.peak_tflops", path) * 1e12;
  p.gemm_efficiency = number(t, "device.gemm_efficiency", path);
  p.attention_efficiency = number(t, "device.attention_efficiency", path);
  p.gemm_half_rows = number(t, "device.gemm_half_rows", path);
  p.grouped_gemm_efficiency = number(t, "device.grouped_gemm_efficiency", path);
  MOETRON_CHECK(
      p.gemm_efficiency <= 1 && p.attention_efficiency <= 1 && p.grouped_gemm_efficiency <= 1,
      "hardware profile '", path, "': efficiencies are fractions of the peak (<= 1)");
  p.memory_bytes = number(t, "device.memory_gib", path) * double(1 << 30);
  p.memory_bandwidth = number(t, "device.memory_tbps", path) * 1e12;
  p.elementwise_bandwidth = number(t, "device.elementwise_tbps", path) * 1e12;
  p.devices_per_node = static_cast<int64_t>(number(t, "device.devices_per_node", path));
  p.intra = {number(t, "intra.bandwidth_gbps", path) * 1e9,
             number(t, "intra.latency_us", path) * 1e-6};
  p.inter = {number(t, "inter.bandwidth_gbps", path) * 1e9,
             number(t, "inter.latency_us", path) * 1e-6};
  p.host_memory_bytes = number(t, "host.memory_gib", path) * double(1 << 30);
  p.host_memory_bandwidth = number(t, "host.memory_tbps", path) * 1e12;
  p.pcie_bandwidth = number(t, "host.pcie_gbps", path) * 1e9;
  if (const toml::table* s = t["sources"].as_table()) {
    for (const auto& [k, v] : *s) p.sources[std::string(k.str())] = v.value_or(std::string());
  }
  return p;
}

void write_hardware_profile(const std::string& path, const HardwareProfile& p) {
  auto quoted = [](const std::string& text) {  // a TOML basic string
    std::string q = "\"";
    for (const char c : text) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  std::ostringstream out;
  out << "# Written by `moetron calibrate`: every number from a micro-benchmark\n"
      << "# run on this machine (see [sources]).\n"
      << "name = " << quoted(p.name) << "\n\n[device]\n"
      << "peak_tflops = " << p.peak_flops / 1e12 << "\n"
      << "gemm_efficiency = " << p.gemm_efficiency << "\n"
      << "gemm_half_rows = " << p.gemm_half_rows << "\n"
      << "grouped_gemm_efficiency = " << p.grouped_gemm_efficiency << "\n"
      << "attention_efficiency = " << p.attention_efficiency << "\n"
      << "memory_gib = " << p.memory_bytes / double(1 << 30) << "\n"
      << "memory_tbps = " << p.memory_bandwidth / 1e12 << "\n"
      << "elementwise_tbps = " << p.elementwise_bandwidth / 1e12 << "\n"
      << "devices_per_node = " << p.devices_per_node << "\n";
  for (const auto& [section, link] : {std::pair{"intra", p.intra}, std::pair{"inter", p.inter}}) {
    out << "\n[" << section << "]\nbandwidth_gbps = " << link.bandwidth / 1e9
        << "\nlatency_us = " << link.latency * 1e6 << "\n";
  }
  out << "\n[host]\nmemory_gib = " << p.host_memory_bytes / double(1 << 30)
      << "\nmemory_tbps = " << p.host_memory_bandwidth / 1e12
      << "\npcie_gbps = " << p.pcie_bandwidth / 1e9 << "\n";
  out << "\n[sources]\n";
  for (const auto& [k, v] : p.sources) out << quoted(k) << " = " << quoted(v) << "\n";
  write_file_atomically(path, out.str());
}

GemmFit fit_gemm_rows(const std::vector<std::pair<double, double>>& samples, double peak_flops) {
  MOETRON_CHECK(samples.size() >= 2 && peak_flops > 0,
                "fit_gemm_rows: needs two samples and a peak");
  std::vector<std::pair<double, double>> s = samples;
  std::sort(s.begin(), s.end());
  GemmFit fit;
  fit.efficiency = std::min(1.0, s.back().second / peak_flops);
  std::vector<double> halves;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const double eff = s[i].second / peak_flops;
    halves.push_back(std::max(0.0, s[i].first * (fit.efficiency / eff - 1)));
  }
  std::sort(halves.begin(), halves.end());
  fit.half_rows = std::max(1.0, halves[halves.size() / 2]);
  return fit;
}

Link fit_link(const std::vector<std::pair<double, double>>& samples) {
  MOETRON_CHECK(samples.size() >= 2, "fit_link: needs two sizes");
  // seconds = a + bytes * c: least squares, then latency a / 2, bandwidth 1 / c.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : samples) {
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  double c = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  if (!(c > 0)) {
    // Times that do not grow with bytes (a machine too busy to measure):
    // the largest message's whole time as if it were all bandwidth, which
    // overstates the cost rather than understating it.
    const auto largest = *std::max_element(samples.begin(), samples.end());
    MOETRON_CHECK(largest.first > 0 && largest.second > 0, "fit_link: no positive sample");
    c = largest.second / largest.first;
  }
  // The latency from the smallest message, less its bytes' share: a
  // least-squares intercept of noisy large messages can come out <= 0.
  const auto smallest = *std::min_element(samples.begin(), samples.end());
  const double rest = smallest.second - smallest.first * c;
  return {1 / c, rest > 0 ? rest / 2 : smallest.second / 2};
}

}  // namespace moetron::planner
