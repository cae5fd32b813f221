// Training checkpoints: RUN_DIR/checkpoints/step-N/ holding
//   model.safetensors  Hugging Face Mixtral names, [out, in], fp32 master weights
//                      (the ones rank 0 writes); a layout whose ranks hold
//                      different parameters (expert parallelism, tp shards,
//                      ZeRO-1 chunks) adds model-rank-R.safetensors for each
//                      other rank that writes some, and manifest.json lists
//                      them ("model_files") with the layout that wrote them.
//                      Each rank writes what it holds, nothing is gathered: a
//                      tp shard is a block, a ZeRO-1 chunk a range of its
//                      tensor (or of its tp block), with its place in the full
//                      tensor in the metadata (ckpt/pieces.h); `moetron
//                      export` assembles whole tensors
//   config.json        Hugging Face style model config
//   state.safetensors  router selection biases
//   optimizer-rank-R.safetensors  the moments/momenta rank R holds: each tensor
//                      is a flat slice of one state tensor, its element range in
//                      the metadata ("<name>" -> "offset,total"), a tp block
//                      ("block:row0,col0,R,C") or a range of one, so a run
//                      resumes on another dp or tp by re-cutting the pieces
//   trainer.json       step, sampler position, loss scale, counters, dp
//   moetron.toml       the full run configuration
//   manifest.json      size and xxHash64 of every file above
// Written into a staging directory, fsync'd and renamed (core/staged_dir.h):
// a directory named step-N is always complete. With several ranks, rank 0
// stages and publishes, every rank writes its own optimizer file into the
// staging directory first (the run directory is on a filesystem all ranks
// share), and a failure on any rank leaves nothing published. Loading
// verifies every checksum first.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"

namespace moetron::ckpt {

std::string checkpoint_dir(const std::string& run_dir, int64_t step);
// N of a ".../step-N" directory.
int64_t checkpoint_step(const std::string& dir);

// The Hugging Face config.json of a model.
nlohmann::json hf_config(const nn::ModelConfig& model, const nn::MoeConfig& moe);

// What save_checkpoint writes beside the model and the optimizer.
struct SaveRequest {
  std::string run_dir;
  int64_t step = 0;
  nlohmann::json trainer_state;  // trainer.json
  std::string config_toml;       // config.toml: the run's full configuration
  int64_t keep = 2;              // complete checkpoints kept (of this model)
  // Identifies the model (train::model_signature); recorded in the manifest.
  // Pruning removes only checkpoints recorded with the same signature, so a
  // run resumed with another model never deletes the original's checkpoints.
  std::string model_signature;
  comm::Communicator* world = nullptr;  // nullptr: one rank
  // More per-rank state saved beside the optimizer's (error-feedback residuals).
  std::vector<optim::StateSlice> extra;
  // Whether this rank stores the parameter (or the replicated optimizer
  // state) of that name; every name must be written by exactly one rank.
  // Empty: rank 0 writes everything.
  std::function<bool(const std::string&)> writes;
  // Fault hook: called on every rank before it writes its files into the
  // staging directory `dir`; what it throws fails the save on every rank.
  std::function<void(const std::string& dir)> before_write;
};

// Saves step req.step and then deletes all but the newest req.keep complete
// checkpoints of the same model (and the staging directories of dead writers). On any failure the
// previous checkpoints are untouched and the partial one is removed; the error propagates (on every
// rank). Collective over req.world.
void save_checkpoint(const SaveRequest& req, nn::Transformer& model, optim::ParamOptimizer& opt);

// Deletes all but the newest `keep` complete checkpoints recorded with
// `model_signature` in RUN_DIR/checkpoints, and the staging directories of
// dead writers.
void prune_checkpoints(const std::string& run_dir, int64_t keep,
                       const std::string& model_signature);

// The newest checkpoint whose manifest verifies; each skipped (corrupt or
// truncated) one adds a warning naming it (and its path to `skipped`).
// nullopt if none.
std::optional<std::string> latest_checkpoint(const std::string& run_dir,
                                             std::vector<std::string>* warnings,
                                             std::vector<std::string>* skipped = nullptr);

// A checkpoint directory from what a user gave: a checkpoint (it has a
// manifest.json) as is, or a run directory (it has checkpoints/): its newest
// complete checkpoint. Throws naming the path and what it lacks.
std::string resolve_checkpoint_dir(const std::string& path);

// Removes RUN_DIR/checkpoints/step-N.tmp-PID staging directories whose
// writer (process PID on this machine) is no longer alive: what a save killed
// mid-way leaves behind. Returns the paths removed.
std::vector<std::string> remove_dead_staging_dirs(const std::string& run_dir);

// Renames a corrupt checkpoint to step-N.corrupt[-k] so the step can be saved
// again while the damaged files stay available for inspection (nothing is
// deleted). Returns the new path.
std::string quarantine_checkpoint(const std::string& dir);

// Loads the weights (into the optimizer's fp32 masters, which round them
// into the live values, when opt is given) and the router biases; no
// optimizer state. Errors name the file.
void load_weights(const std::string& dir, nn::Transformer& model, optim::ParamOptimizer* opt);

// Loads weights (and optimizer state and router biases when opt is given)
// after verifying the manifest; returns trainer.json. The optimizer's slices
// are cut from whatever slices the checkpoint's ranks saved. Errors name the file.
// `extra`: more per-rank state saved beside the optimizer's (error-feedback
// residuals), loaded the same way.
nlohmann::json load_checkpoint(const std::string& dir, nn::Transformer& model,
                               optim::ParamOptimizer* opt,
                               const std::vector<optim::StateSlice>& extra = {});

}  // namespace moetron::ckpt
