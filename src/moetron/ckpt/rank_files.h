// The files one rank contributes to a checkpoint, and their names. A disk
// checkpoint (ckpt/checkpoint.h), an in-memory snapshot (ckpt/snapshot.h)
// and a snapshot persisted to disk (ckpt/persist.h) are all made of the same
// per-rank files, so each can be loaded by load_checkpoint and resharded to
// any layout:
//   rank 0      model.safetensors, state.safetensors, config.json,
//               trainer.json, moetron.toml, optimizer-rank-0.safetensors
//   rank R > 0  model-rank-R.safetensors (when it holds weights nobody else
//               writes: tp blocks, experts, ZeRO-1 chunks), optimizer-rank-R.safetensors
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/ckpt/pieces.h"
#include "moetron/ckpt/safetensors.h"

namespace moetron::ckpt {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kStateFile = "state.safetensors";
inline constexpr const char* kTrainerFile = "trainer.json";
inline constexpr const char* kRunConfigFile = "moetron.toml";
inline constexpr const char* kHfConfigFile = "config.json";

std::string optimizer_file(int rank);
std::string model_file(int rank);  // model.safetensors for rank 0
std::string router_bias_name(const nn::MoeLayer& layer);
// Where an optimizer slice lies in its full state tensor.
Piece piece_of(const optim::StateSlice& sl);

// Whether this rank stores the tensor of that name (see SaveRequest::writes).
using WritesFn = std::function<bool(const std::string&)>;

// What one rank writes: views of the live state, nothing copied.
struct RankFiles {
  int rank = 0;
  std::vector<NamedTensor> weights;  // fp32 masters, each as this rank holds it
  std::map<std::string, std::string> weight_meta = {{"format", "pt"}};
  std::vector<optim::StateSlice> slices;  // optimizer state and req.extra
  bool has_model_file() const { return rank == 0 || !weights.empty(); }
  // The tensors' bytes: what the rank's files hold, less headers and configs.
  int64_t tensor_bytes() const;
};
RankFiles rank_files_to_write(int rank, nn::Transformer& model, optim::ParamOptimizer& opt,
                              const WritesFn& writes, const std::vector<optim::StateSlice>& extra);

// Writes them into the existing directory `dir` (rank 0 adds the router
// biases, the configs and req.trainer_state); returns the names written and
// the checksums computed while writing (the tensor files'; for
// write_manifest). Throws naming the file on any I/O error.
struct WrittenFiles {
  std::vector<std::string> names;
  std::map<std::string, std::string> checksums;
};
WrittenFiles write_rank_files(const std::string& dir, const RankFiles& files,
                              nn::Transformer& model, const SaveRequest& req);

// The "state" of a complete checkpoint's manifest: what load_checkpoint and
// pruning read. `layout` holds dp/tp/ep/pp of the writing job.
nlohmann::json checkpoint_manifest_state(int64_t step, int ranks,
                                         const std::vector<std::string>& model_files,
                                         const nlohmann::json& layout,
                                         const std::string& model_signature);

// dp/tp/ep/pp of the trainer state a checkpoint records.
nlohmann::json layout_of(const nlohmann::json& trainer_state);

}  // namespace moetron::ckpt
