// `moetron export`: a checkpoint of any layout (one model file, or the model
// files of the ranks of an expert-parallel run) as one Hugging Face Mixtral
// directory: model.safetensors with every tensor once (fp32, sorted by name)
// and config.json.
#pragma once

#include <cstdint>
#include <string>

namespace moetron::ckpt {

// Verifies the checkpoint's manifest, gathers its model files and publishes
// `out_dir` atomically (it must not exist). Returns the number of tensors.
// Errors name the file and tensor (a tensor in two files, a missing file).
int64_t export_hf(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace moetron::ckpt
