// What a run directory may be reused for. Training into a directory that
// already holds a run needs --resume; a resume must build the model its
// checkpoint holds (the model and routing keys, named when they differ)
// unless the user allows a key to change (--allow-config-change key,...).
#pragma once

#include <string>
#include <vector>

#include "moetron/train/config.h"

namespace moetron::train {

// The keys that change the model's parameters, its routing or what its
// attention sees: every model.* key but init_std, the attention.* keys, and
// the moe.* keys but the loss coefficients and the bias update rate
// (training choices, not the model).
std::vector<std::string> model_config_keys();

// "key = value" lines of the model_config_keys(): equal for two configs
// exactly when they build the same model. Checkpoints record it so pruning
// never removes a checkpoint of another model.
std::string model_signature(const Config& cfg);

// "model.n_layers: 4 -> 2" for each model key that differs between the
// checkpoint's config and this run's and is not in `allowed`.
std::vector<std::string> changed_model_keys(const Config& saved, const Config& now,
                                            const std::vector<std::string>& allowed);

// Throws moetron::Error naming the keys (and how to allow them) when
// changed_model_keys() is not empty; `checkpoint` is named in the message.
// Every key in `allowed` must be a config key (the error suggests the nearest).
void check_resume_config(const Config& saved, const Config& now,
                         const std::vector<std::string>& allowed, const std::string& checkpoint);

// What in run_dir shows that it already holds a run ("checkpoints/step-4",
// "metrics.jsonl (12 lines)"); empty for a new or empty directory.
std::vector<std::string> existing_run_files(const std::string& run_dir);

}  // namespace moetron::train
