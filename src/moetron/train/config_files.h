// Finding the files under configs/ that commands name by a short name
// (--device h200, --model mixtral-8x7b, parallel.auto_device).
#pragma once

#include <string>

namespace moetron::train {

// configs/<dir>/<name>.toml under the working directory or beside the
// binary's checkout; `name` ending in .toml is a path, returned as is when
// it exists. Throws naming `option` and what was looked for.
std::string find_configs_file(const std::string& dir, const std::string& name,
                              const std::string& option);

}  // namespace moetron::train
