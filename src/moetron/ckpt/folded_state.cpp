#include "moetron/ckpt/folded_state.h"

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "moetron/ckpt/pieces.h"
#include "moetron/ckpt/rank_files.h"
#include "moetron/core/error.h"
#include "moetron/core/manifest.h"

namespace moetron::ckpt {

std::string folded_name(const std::string& base, int index) {
  return base + "#" + std::to_string(index);
}

namespace {

// "BASE#i" -> (BASE, i); i = -1 for any other name.
std::pair<std::string, int> split_folded(const std::string& name) {
  const size_t hash = name.rfind('#');
  if (hash == std::string::npos || hash + 1 == name.size()) return {name, -1};
  const std::string digits = name.substr(hash + 1);
  for (char c : digits) {
    if (c < '0' || c > '9') return {name, -1};
  }
  return {name.substr(0, hash), std::stoi(digits)};
}

// Adds the saved piece into `dst` (the whole tensor): copied into zeros
// first, so any piece kind the checkpoint reader knows can be folded.
void add_piece(const Piece& piece, const Tensor& saved, const Tensor& dst,
               const std::string& what) {
  MOETRON_CHECK(saved.dtype() == DType::f32, what, " is ", dtype_name(saved.dtype()),
                ", folded state is f32");
  MOETRON_CHECK(piece.total == dst.numel(), what, " is a piece of ", piece.total,
                " elements, this rank's tensor has ", dst.numel(), " (saved from another model?)");
  Tensor part = Tensor::zeros({dst.numel()}, DType::f32, MemTag::workspace);
  copy_overlap(piece, saved, Piece::whole(dst.numel()), part);
  float* d = dst.data<float>();
  const float* p = part.data<float>();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += p[i];
}

}  // namespace

int64_t load_folded(const std::string& dir, const std::vector<FoldTarget>& targets, int index,
                    int size) {
  MOETRON_CHECK(size > 0 && index >= 0 && index < size, "load_folded: index ", index,
                " outside a group of ", size);
  std::map<std::string, const Tensor*> by_base;
  for (const FoldTarget& t : targets) {
    for (const auto& b : t.bases) by_base[b] = &t.values;
  }
  std::ifstream f(dir + "/" + kManifestName);
  const nlohmann::json manifest = nlohmann::json::parse(f);
  const int64_t ranks = manifest.value("state", nlohmann::json::object())
                            .value("optimizer_ranks", manifest.value("optimizer_ranks", 1));
  int64_t added = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    const std::string path = dir + "/" + optimizer_file(static_cast<int>(r));
    SafetensorsReader file(path);
    for (const std::string& name : file.names()) {
      const auto [base, i] = split_folded(name);
      if (i < 0 || i % size != index) continue;
      const auto target = by_base.find(base);
      if (target == by_base.end()) continue;
      const auto meta = file.metadata().find(name);
      const std::string what = str_cat("'", path, "', tensor '", name, "'");
      const Tensor saved = file.view(name);
      const Piece piece = Piece::parse(
          meta == file.metadata().end() ? std::nullopt : std::optional<std::string>(meta->second),
          saved.shape(), what);
      add_piece(piece, saved, *target->second, what);
      ++added;
    }
  }
  return added;
}

}  // namespace moetron::ckpt
