#include "moetron/ckpt/export.h"

#include <toml++/toml.h>

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

namespace {

std::vector<std::string> model_paths(const std::string& dir, const nlohmann::json& state) {
  std::vector<std::string> paths;
  for (const auto& f : state.value("model_files", nlohmann::json::array({"model.safetensors"}))) {
    paths.push_back(dir + "/" + f.get<std::string>());
  }
  return paths;
}

// What the run's moetron.toml says about attention or routing that Mixtral
// cannot express. Mixtral applies its one `sliding_window` to every layer and
// has no global tokens, so only an all-local pattern without them exports.
std::string attention_mismatch(const toml::table& t) {
  const int64_t window = t["attention"]["window"].value_or(int64_t{0});
  if (window <= 0) return "";
  if (t["attention"]["global_tokens"].value_or(int64_t{0}) > 0)
    return "its local layers attend to global tokens (attention.global_tokens)";
  const std::string pattern = t["attention"]["layer_pattern"].value_or(std::string());
  if (pattern.find('G') != std::string::npos)
    return "it mixes sliding-window and full-attention layers (attention.layer_pattern = '" +
           pattern + "'; config.json's layer_types says which, a field Mixtral does not read)";
  return "";
}

std::string routing_mismatch(const std::string& dir) {
  toml::table t;
  try {
    t = toml::parse_file(dir + "/moetron.toml");
  } catch (const toml::parse_error&) {
    return "";  // the manifest verified it; an older checkpoint may lack keys
  }
  if (std::string why = attention_mismatch(t); !why.empty()) return why;
  if (t["moe"]["router_score"].value_or(std::string("softmax")) != "softmax")
    return "its router scores are sigmoid (moe.router_score), Mixtral's softmax";
  if (!t["moe"]["renormalize"].value_or(true))
    return "its top-k weights are not renormalised (moe.renormalize = false)";
  if (t["moe"]["bias_update_rate"].value_or(0.0) > 0)
    return "its experts are selected with aux-loss-free biases (moe.bias_update_rate > 0)";
  return "";
}

}  // namespace

std::string mixtral_mismatch(const std::string& dir) {
  const nlohmann::json state = verify_manifest(dir);
  const PieceIndex pieces(model_paths(dir, state));
  for (const std::string& name : pieces.names()) {
    if (name.starts_with("vision.") || name.starts_with("audio."))
      return "it has modality encoders ('" + name + "'; multimodal.enabled)";
    if (name.find(".gate.modality_") != std::string::npos)
      return "it routes by modality ('" + name + "'; moe.modality_routing)";
    if (name.find(".cross_attn.") != std::string::npos)
      return "it has cross-attention layers ('" + name + "'; multimodal.fusion)";
    if (name.find(".mlp.shared_experts.") != std::string::npos)
      return "it has shared experts ('" + name + "')";
    if (name.find(".mlp.") != std::string::npos)
      return "it has dense layers ('" + name + "'; moe.first_dense_layers or moe.every)";
  }
  return routing_mismatch(dir);
}

int64_t export_hf(const std::string& dir, const std::string& out_dir, const ExportOptions& opts) {
  const nlohmann::json state = verify_manifest(dir);
  if (!opts.tensors_only) {
    const std::string why = mixtral_mismatch(dir);
    MOETRON_CHECK(why.empty(), "cannot export '", dir,
                  "' as a Hugging Face MixtralForCausalLM: ", why,
                  ", which Mixtral cannot represent (Hugging Face would load another model, ",
                  "with only a warning); pass --tensors-only for its tensors alone");
  }
  // Whole tensors, assembled from every rank's pieces (tp blocks, ep experts).
  const PieceIndex pieces(model_paths(dir, state));
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
  const char* config = opts.tensors_only ? "moetron.toml" : "config.json";
  std::filesystem::copy_file(dir + "/" + config, out.file(config));
  out.commit();
  return static_cast<int64_t>(tensors.size());
}

}  // namespace moetron::ckpt
