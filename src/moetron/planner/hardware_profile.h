// A hardware profile: what the cost model (planner/cost_model.h) needs to
// know about a device and its links, read from configs/hardware/*.toml.
// Every number carries its source (a vendor datasheet, a paper, or the
// micro-benchmark that measured it), so a prediction can be traced to what
// it assumed.
//
//   name = "h200"
//   [device]    peak_tflops, gemm_efficiency, gemm_half_rows,
//               grouped_gemm_efficiency, attention_efficiency, memory_gib,
//               memory_tbps (HBM bandwidth, TB/s), elementwise_tbps,
//               devices_per_node
//   [intra]     bandwidth_gbps (GB/s per direction per device), latency_us
//   [inter]     bandwidth_gbps, latency_us
//   [host]      memory_gib, memory_tbps (per device: its share of the host),
//               pcie_gbps (per device, one direction): for offload
//   [sources]   one string per key above ("device.peak_tflops" = "...")
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace moetron::planner {

// One link class: time(bytes) = latency + bytes / bandwidth (alpha-beta).
struct Link {
  double bandwidth = 0;  // bytes/s per direction per device
  double latency = 0;    // seconds per message
};

struct HardwareProfile {
  std::string name;
  double peak_flops = 0;         // dense bf16 FLOP/s per device
  double gemm_efficiency = 0.5;  // achieved / peak on the model's GEMMs (large)
  // Rows (tokens) at which a GEMM reaches half of gemm_efficiency: a GEMM
  // of m rows runs at gemm_efficiency x m / (m + gemm_half_rows).
  double gemm_half_rows = 64;
  // The experts' grouped GEMMs (many matrices in one call, uneven groups):
  // their large-group efficiency, scaled by rows as the dense ones.
  double grouped_gemm_efficiency = 0.5;
  double attention_efficiency = 0.3;
  double memory_bytes = 0;      // per device
  double memory_bandwidth = 0;  // bytes/s: the optimizer step's streams
  // Bytes/s the elementwise kernels (norms, residual adds, SwiGLU) reach in
  // the bytes the cost model counts for them: the memory's bandwidth where
  // they are memory-bound (GPUs), less where their arithmetic (exp,
  // conversions) limits them (a CPU core).
  double elementwise_bandwidth = 0;
  int64_t devices_per_node = 1;
  Link intra, inter;  // within a node, between nodes
  // The host's share per device (offload): memory, its bandwidth, and the
  // device's PCIe link (bytes/s one way).
  double host_memory_bytes = 0, host_memory_bandwidth = 0, pcie_bandwidth = 0;
  std::map<std::string, std::string> sources;
};

// Reads a profile; an unknown, missing or non-positive key is an error naming
// the key and the file.
HardwareProfile load_hardware_profile(const std::string& path);
// Writes `p` in the form load_hardware_profile reads (with its sources),
// whole to a temporary name and renamed: a failure leaves no partial file.
void write_hardware_profile(const std::string& path, const HardwareProfile& p);

// Calibration fits, from micro-benchmark samples:
// GEMM rate by rows: (rows, FLOP/s) -> the large-GEMM efficiency (the
// largest sample's rate / peak) and the rows at which the rate is half of
// it (the median over the smaller samples of m (eff / eff(m) - 1)).
struct GemmFit {
  double efficiency = 0, half_rows = 0;
};
GemmFit fit_gemm_rows(const std::vector<std::pair<double, double>>& samples, double peak_flops);
// A 2-rank all-reduce's (bytes, seconds) at two or more sizes -> the link:
// time = 2 latency + bytes / bandwidth (the bandwidth by least squares, the
// latency from the smallest message; always positive). When the times do not
// grow with bytes (a busy machine), the largest message's time is taken as
// all bandwidth: an overstated cost, never an understated one.
Link fit_link(const std::vector<std::pair<double, double>>& samples);

}  // namespace moetron::planner
