// Energy counters of the machine a rank runs on (monitor.energy): RAPL
// through Linux's powercap interface (each CPU package and, where the
// kernel exposes it, DRAM) and every NVIDIA GPU through NVML, which is
// loaded at run time (dlopen), so the binary needs no driver to start.
// Both are machine-wide cumulative counters: they measure everything the
// machine draws while the run is on it, not this process's share.
//
// A virtual machine usually exposes neither (this project's development
// machine has no /sys/class/powercap and no GPU): the meter then has no
// domains and says why (describe()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moetron::monitor {

// One counter's energy since the previous read.
struct EnergyDelta {
  std::string domain;  // "package-0", "dram-0", "gpu-0", ...
  double joules = 0;
  bool in_total = true;  // false for RAPL sub-domains that a package already counts
};

class EnergyMeter {
 public:
  // Finds the readable RAPL zones under `powercap_root` and, when
  // `use_nvml`, the GPUs NVML reports; reads each counter once.
  explicit EnergyMeter(const std::string& powercap_root = "/sys/class/powercap",
                       bool use_nvml = true);
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool available() const;
  std::vector<std::string> domains() const;
  // Each domain's joules since the previous read (or construction). A RAPL
  // counter wraps at max_energy_range_uj: one wrap between reads is
  // undone, so reads must come more often than a wrap (minutes at full
  // power on a large package; every step does).
  std::vector<EnergyDelta> read();
  // "RAPL package-0, dram-0; NVML gpu-0", or why there is nothing.
  std::string describe() const;

 private:
  struct RaplZone {
    std::string domain, energy_path;
    double range_uj = 0, last_uj = 0;
    bool in_total = true;
  };
  struct Nvml;

  void find_rapl(const std::string& root);
  void find_gpus();

  std::vector<RaplZone> rapl_;
  std::unique_ptr<Nvml> nvml_;
  std::vector<std::string> missing_;  // why a source gave nothing
};

}  // namespace moetron::monitor
