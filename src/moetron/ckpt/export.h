// `moetron export`: a checkpoint of any layout (one model file, or the model
// files of the ranks of an expert-parallel run) as one Hugging Face
// directory: model.safetensors with every tensor once (fp32, sorted by name)
// and config.json. The architecture is MixtralForCausalLM, which represents
// a pure-MoE model (every layer routed, softmax top-k renormalised, no
// shared experts, no selection bias); a model Mixtral cannot represent
// (dense layers "model.layers.N.mlp.*", shared experts, sigmoid routing,
// aux-loss-free biases) is refused with the reason, unless tensors_only asks
// for the assembled tensors alone (with the run's moetron.toml, no config.json).
#pragma once

#include <cstdint>
#include <string>

namespace moetron::ckpt {

struct ExportOptions {
  bool tensors_only = false;  // any model: model.safetensors + moetron.toml, no HF architecture
};

// Why Mixtral cannot represent the checkpoint's model ("" when it can).
std::string mixtral_mismatch(const std::string& checkpoint_dir);

// Verifies the checkpoint's manifest, gathers its model files and publishes
// `out_dir` atomically (it must not exist). Returns the number of tensors.
// Errors name the file and tensor (a tensor in two files, a missing file),
// or what in the model Mixtral cannot represent.
int64_t export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                  const ExportOptions& opts = {});

}  // namespace moetron::ckpt
