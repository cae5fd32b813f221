// Training checkpoints: RUN_DIR/checkpoints/step-N/ holding
//   model.safetensors  Hugging Face Mixtral names, [out, in], fp32 master weights
//   config.json        Hugging Face style model config
//   state.safetensors  optimizer state (moments, Muon momenta) and router biases
//   trainer.json       step, sampler position, loss scale, counters
//   moetron.toml       the full run configuration
//   manifest.json      size and xxHash64 of every file above
// Written into a staging directory, fsync'd and renamed (core/staged_dir.h):
// a directory named step-N is always complete. Loading verifies every
// checksum first.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"

namespace moetron::ckpt {

std::string checkpoint_dir(const std::string& run_dir, int64_t step);

// The Hugging Face config.json of a model.
nlohmann::json hf_config(const nn::ModelConfig& model, const nn::MoeConfig& moe);

// Saves step `step` and then deletes all but the newest `keep` complete
// checkpoints. On any failure the previous checkpoints are untouched and the
// partial one is removed; the error propagates.
void save_checkpoint(const std::string& run_dir, int64_t step, nn::Transformer& model,
                     optim::Optimizer& opt, const nlohmann::json& trainer_state,
                     const std::string& config_toml, int64_t keep);

// The newest checkpoint whose manifest verifies; each skipped (corrupt or
// truncated) one adds a warning naming it (and its path to `skipped`).
// nullopt if none.
std::optional<std::string> latest_checkpoint(const std::string& run_dir,
                                             std::vector<std::string>* warnings,
                                             std::vector<std::string>* skipped = nullptr);

// Renames a corrupt checkpoint to step-N.corrupt[-k] so the step can be saved
// again while the damaged files stay available for inspection (nothing is
// deleted). Returns the new path.
std::string quarantine_checkpoint(const std::string& dir);

// Loads weights (and optimizer state and router biases when opt is given)
// after verifying the manifest; returns trainer.json. Errors name the file.
nlohmann::json load_checkpoint(const std::string& dir, nn::Transformer& model,
                               optim::Optimizer* opt);

}  // namespace moetron::ckpt
