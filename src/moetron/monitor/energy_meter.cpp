#include "moetron/monitor/energy_meter.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

namespace moetron::monitor {

namespace fs = std::filesystem;

namespace {

bool read_number(const std::string& path, double& value) {
  std::ifstream in(path);
  long double v = 0;
  if (!(in >> v)) return false;
  value = static_cast<double>(v);
  return true;
}

std::string gpu_domain(size_t i) {
  std::string s = "gpu-";
  s += std::to_string(i);
  return s;
}

std::string read_word(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  in >> s;
  return s;
}

}  // namespace

// NVML's C API, loaded with dlopen: the few entry points the meter needs,
// declared here (nvml.h's types: nvmlReturn_t is an int, 0 = success;
// nvmlDevice_t an opaque pointer).
struct EnergyMeter::Nvml {
  using Device = void*;
  void* lib = nullptr;
  int (*shutdown)() = nullptr;
  int (*total_energy)(Device, unsigned long long*) = nullptr;  // millijoules
  std::vector<Device> devices;
  std::vector<unsigned long long> last_mj;

  ~Nvml() {
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

EnergyMeter::EnergyMeter(const std::string& powercap_root, bool use_nvml) {
  find_rapl(powercap_root);
  if (use_nvml) find_gpus();
}

EnergyMeter::~EnergyMeter() = default;

void EnergyMeter::find_rapl(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    missing_.push_back("no " + root + " (RAPL not exposed)");
    return;
  }
  // Top-level zones are intel-rapl:N (a package, or psys: the platform);
  // their sub-zones intel-rapl:N:M (core, uncore, dram). AMD packages use
  // the same interface.
  static const std::regex zone_re(R"(intel-rapl:(\d+)(:\d+)?)");
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(root, ec)) dirs.push_back(e.path().filename());
  std::sort(dirs.begin(), dirs.end());
  int unreadable = 0;
  for (const std::string& d : dirs) {
    std::smatch m;
    if (!std::regex_match(d, m, zone_re)) continue;
    const std::string dir = root + "/" + d;
    const std::string name = read_word(dir + "/name");
    if (name.empty()) continue;
    RaplZone z;
    z.energy_path = dir + "/energy_uj";
    if (!read_number(dir + "/max_energy_range_uj", z.range_uj) ||
        !read_number(z.energy_path, z.last_uj)) {
      ++unreadable;
      continue;
    }
    const bool sub = m[2].matched;
    z.domain = sub ? name + "-" + m[1].str() : name;
    // The total counts packages and DRAM; core and uncore are inside a
    // package, psys (the whole platform) would count the packages twice.
    z.in_total = sub ? name == "dram" : name.rfind("package", 0) == 0;
    rapl_.push_back(z);
  }
  if (unreadable > 0) {
    missing_.push_back(std::to_string(unreadable) + " RAPL zone(s) under " + root +
                       " not readable (energy_uj is root-only)");
  } else if (rapl_.empty()) {
    missing_.push_back("no RAPL zones under " + root);
  }
}

void EnergyMeter::find_gpus() {
  auto n = std::make_unique<Nvml>();
  n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) {
    missing_.push_back("no NVML (libnvidia-ml.so.1: no NVIDIA driver)");
    return;
  }
  const auto sym = [&](const char* name) { return dlsym(n->lib, name); };
  auto init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  auto count = reinterpret_cast<int (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
  auto handle =
      reinterpret_cast<int (*)(unsigned, Nvml::Device*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  n->total_energy = reinterpret_cast<int (*)(Nvml::Device, unsigned long long*)>(
      sym("nvmlDeviceGetTotalEnergyConsumption"));
  if (!init || !count || !handle || !n->total_energy || init() != 0) {
    missing_.push_back("NVML found but could not be initialised");
    return;
  }
  n->shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  unsigned devices = 0;
  if (count(&devices) != 0) devices = 0;
  for (unsigned i = 0; i < devices; ++i) {
    Nvml::Device d = nullptr;
    unsigned long long mj = 0;
    // Energy counters exist from Volta on; older GPUs are left out.
    if (handle(i, &d) != 0 || n->total_energy(d, &mj) != 0) continue;
    n->devices.push_back(d);
    n->last_mj.push_back(mj);
  }
  if (n->devices.empty()) {
    missing_.push_back("NVML reports no GPU with an energy counter");
    return;
  }
  nvml_ = std::move(n);
}

bool EnergyMeter::available() const {
  return !rapl_.empty() || nvml_ != nullptr;
}

std::vector<std::string> EnergyMeter::domains() const {
  std::vector<std::string> out;
  for (const RaplZone& z : rapl_) out.push_back(z.domain);
  if (nvml_) {
    for (size_t i = 0; i < nvml_->devices.size(); ++i) out.push_back(gpu_domain(i));
  }
  return out;
}

std::vector<EnergyDelta> EnergyMeter::read() {
  std::vector<EnergyDelta> out;
  for (RaplZone& z : rapl_) {
    double now = 0;
    if (!read_number(z.energy_path, now)) continue;  // a zone that stopped answering: no delta
    double delta = now - z.last_uj;
    if (delta < 0) delta += z.range_uj;  // the counter wrapped once
    z.last_uj = now;
    out.push_back({z.domain, delta * 1e-6, z.in_total});
  }
  if (nvml_) {
    for (size_t i = 0; i < nvml_->devices.size(); ++i) {
      unsigned long long mj = 0;
      if (nvml_->total_energy(nvml_->devices[i], &mj) != 0) continue;
      const unsigned long long delta = mj >= nvml_->last_mj[i] ? mj - nvml_->last_mj[i] : 0;
      nvml_->last_mj[i] = mj;
      out.push_back({gpu_domain(i), static_cast<double>(delta) * 1e-3, true});
    }
  }
  return out;
}

std::string EnergyMeter::describe() const {
  std::string s;
  if (!rapl_.empty()) {
    s = "RAPL";
    for (size_t i = 0; i < rapl_.size(); ++i) s.append(i ? ", " : " ").append(rapl_[i].domain);
  }
  if (nvml_) {
    s += s.empty() ? "NVML" : "; NVML";
    for (size_t i = 0; i < nvml_->devices.size(); ++i)
      s.append(i ? ", " : " ").append(gpu_domain(i));
  }
  if (s.empty()) {
    s = "no energy counters readable here";
    for (size_t i = 0; i < missing_.size(); ++i) s.append(i ? "; " : ": ").append(missing_[i]);
  }
  return s;
}

}  // namespace moetron::monitor
