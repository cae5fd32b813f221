// A planner preset (configs/scale/<preset>.toml) on a shipped hardware
// profile (configs/hardware/<device>.toml) as a cost model, for the
// planner's tests.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/planner/cost_model.h"

namespace moetron::test {

// global_batch 0: the preset's own.
planner::CostModel preset_model(const std::string& preset, const std::string& device,
                                int64_t devices_per_node, int64_t global_batch = 0);

}  // namespace moetron::test
