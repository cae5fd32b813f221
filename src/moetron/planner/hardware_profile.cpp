#include "moetron/planner/hardware_profile.h"

#include <toml++/toml.h>

#include <filesystem>
#include <set>

#include "moetron/core/error.h"

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
       {"peak_tflops", "gemm_efficiency", "gemm_half_rows", "attention_efficiency", "memory_gib",
        "memory_tbps", "devices_per_node"}},
      {"intra", {"bandwidth_gbps", "latency_us"}},
      {"inter", {"bandwidth_gbps", "latency_us"}}};
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
  MOETRON_CHECK(p.gemm_efficiency <= 1 && p.attention_efficiency <= 1, "hardware profile '", path,
                "': efficiencies are fractions of the peak (<= 1)");
  p.memory_bytes = number(t, "device.memory_gib", path) * double(1 << 30);
  p.memory_bandwidth = number(t, "device.memory_tbps", path) * 1e12;
  p.devices_per_node = static_cast<int64_t>(number(t, "device.devices_per_node", path));
  p.intra = {number(t, "intra.bandwidth_gbps", path) * 1e9,
             number(t, "intra.latency_us", path) * 1e-6};
  p.inter = {number(t, "inter.bandwidth_gbps", path) * 1e9,
             number(t, "inter.latency_us", path) * 1e-6};
  if (const toml::table* s = t["sources"].as_table()) {
    for (const auto& [k, v] : *s) p.sources[std::string(k.str())] = v.value_or(std::string());
  }
  return p;
}

HardwareProfile hardware_profile_named(const std::string& configs_dir, const std::string& name) {
  const std::string path = configs_dir + "/hardware/" + name + ".toml";
  MOETRON_CHECK(std::filesystem::exists(path), "--device '", name, "': no profile '", path, "'");
  return load_hardware_profile(path);
}

}  // namespace moetron::planner
