#include "moetron/train/config_files.h"

#include <filesystem>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::train {

namespace fs = std::filesystem;

std::string find_configs_file(const std::string& dir, const std::string& name,
                              const std::string& option) {
  if (name.ends_with(".toml")) {
    MOETRON_CHECK(fs::exists(name), option, " '", name, "': no such file");
    return name;
  }
  std::vector<fs::path> roots = {fs::current_path() / "configs"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    roots.push_back(exe.parent_path().parent_path() / "configs");
    roots.push_back(exe.parent_path() / "configs");
  }
  for (const auto& r : roots) {
    const fs::path f = r / dir / (name + ".toml");
    if (fs::exists(f)) return f.string();
  }
  MOETRON_FAIL(option, " '", name, "': no configs/", dir, "/", name,
               ".toml under the working directory or beside the binary");
}

}  // namespace moetron::train
