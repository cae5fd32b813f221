// `moetron calibrate`: measures this machine with micro-benchmarks (GEMMs by
// rows, attention forward + backward, a streaming copy, and under mpirun
// with 2 ranks an all-reduce at several sizes) and writes a hardware profile
// the planner reads (planner/hardware_profile.h). Never times a training step.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace moetron::cli {

struct CalibrateCommand {
  std::string out = "configs/hardware/this-machine.toml";
  std::string name = "this-machine";
  int64_t threads = 1;           // per device (a device is one rank)
  int64_t devices_per_node = 0;  // 0: cores / threads
  int64_t seq_len = 512;         // the attention probe's
};

CLI::App* add_calibrate_command(CLI::App& app, CalibrateCommand& opts);
int run_calibrate_command(const CalibrateCommand& opts);

}  // namespace moetron::cli
