// A registry Snapshot as one JSON object, series key -> value: the "series"
// field of each metrics.jsonl line. Histograms give name_sum and name_count.
#pragma once

#include <nlohmann/json.hpp>

#include "moetron/monitor/metric_registry.h"

namespace moetron::monitor {

nlohmann::json json_series(const Snapshot& snapshot);

}  // namespace moetron::monitor
