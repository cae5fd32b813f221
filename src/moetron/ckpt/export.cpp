#include "moetron/ckpt/export.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "moetron/ckpt/safetensors.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"

namespace moetron::ckpt {

int64_t export_hf(const std::string& dir, const std::string& out_dir) {
  const nlohmann::json state = verify_manifest(dir);
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, std::pair<SafetensorsReader*, std::string>> where;  // name -> (file, file name)
  for (const auto& f : state.value("model_files", nlohmann::json::array({"model.safetensors"}))) {
    const std::string name = f.get<std::string>();
    files.push_back(std::make_unique<SafetensorsReader>(dir + "/" + name));
    for (const std::string& t : files.back()->names()) {
      const auto [it, fresh] = where.emplace(t, std::make_pair(files.back().get(), name));
      MOETRON_CHECK(fresh, "checkpoint '", dir, "': tensor '", t, "' is in both '", it->second.second, "' and '",
                    name, "'");
    }
  }
  std::vector<NamedTensor> tensors;  // std::map order: sorted by name
  for (const auto& [name, file] : where) tensors.push_back({name, file.first->view(name)});
  StagedDir out(out_dir);
  write_safetensors(out.file("model.safetensors"), tensors, {{"format", "pt"}});
  std::filesystem::copy_file(dir + "/config.json", out.file("config.json"));
  out.commit();
  return static_cast<int64_t>(tensors.size());
}

}  // namespace moetron::ckpt
