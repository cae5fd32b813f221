#include "util/preset_model.h"

#include "moetron/train/auto_layout.h"
#include "moetron/train/config.h"

namespace moetron::test {

planner::CostModel preset_model(const std::string& preset, const std::string& device,
                                int64_t devices_per_node, int64_t global_batch) {
  const std::string configs = MOETRON_SOURCE_DIR "/configs";
  const train::Config cfg = train::load_config(configs + "/scale/" + preset + ".toml", {});
  planner::HardwareProfile hw =
      planner::load_hardware_profile(configs + "/hardware/" + device + ".toml");
  hw.devices_per_node = devices_per_node;
  planner::Workload w = train::planner_workload(cfg);
  if (global_batch > 0) w.global_batch = global_batch;
  return planner::CostModel(w, hw);
}

}  // namespace moetron::test
