#include "moetron/ckpt/export.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "moetron/ckpt/pieces.h"
#include "moetron/ckpt/safetensors.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"

namespace moetron::ckpt {

int64_t export_hf(const std::string& dir, const std::string& out_dir) {
  const nlohmann::json state = verify_manifest(dir);
  std::vector<std::string> paths;
  for (const auto& f : state.value("model_files", nlohmann::json::array({"model.safetensors"}))) {
    paths.push_back(dir + "/" + f.get<std::string>());
  }
  // Whole tensors, assembled from every rank's pieces (tp blocks, ep experts).
  const PieceIndex pieces(paths);
  std::vector<Tensor> keep;
  std::vector<NamedTensor> tensors;  // sorted by name
  for (const std::string& name : pieces.names()) {
    const Shape full = pieces.full_shape(name);
    keep.push_back(Tensor::empty(full, pieces.dtype(name), MemTag::workspace));
    pieces.read(name, full, Piece::whole(full.numel()), keep.back());
    tensors.push_back({name, keep.back()});
  }
  StagedDir out(out_dir);
  write_safetensors(out.file("model.safetensors"), tensors, {{"format", "pt"}});
  std::filesystem::copy_file(dir + "/config.json", out.file("config.json"));
  out.commit();
  return static_cast<int64_t>(tensors.size());
}

}  // namespace moetron::ckpt
