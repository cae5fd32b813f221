#include "moetron/ckpt/rank_files.h"

#include <fstream>

#include "moetron/core/error.h"

namespace moetron::ckpt {

std::string optimizer_file(int rank) {
  return "optimizer-rank-" + std::to_string(rank) + ".safetensors";
}

std::string model_file(int rank) {
  return rank == 0 ? kModelFile : "model-rank-" + std::to_string(rank) + ".safetensors";
}

std::string router_bias_name(const nn::MoeLayer& layer) {
  return layer.prefix() + "block_sparse_moe.e_score_correction_bias";
}

Piece piece_of(const optim::StateSlice& sl) {
  if (sl.block_of) {
    const nn::Parameter& p = *sl.block_of;
    return Piece::block_range(p.shard.full, p.shard.row0, p.shard.col0, p.value.shape(), sl.offset,
                              sl.values.numel());
  }
  return Piece::flat(sl.offset, sl.values.numel(), sl.total);
}

namespace {

std::string write_optimizer_slices(const std::string& path,
                                   const std::vector<optim::StateSlice>& slices) {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> meta;
  for (const auto& sl : slices) {
    const Piece piece = piece_of(sl);
    // A whole block is stored in its [rows, cols] shape, so readers see the block.
    tensors.push_back(
        {sl.name, piece.whole_block() ? sl.values.reshape(sl.block_of->value.shape()) : sl.values});
    meta[sl.name] = piece.is_block() ? piece.metadata()
                                     : std::to_string(sl.offset) + "," + std::to_string(sl.total);
  }
  return write_safetensors(path, tensors, meta);
}

// The fp32 masters (resume is exact) this rank writes, each as this rank
// holds it, never gathered: a tp block by its own rank, a ZeRO-1 chunk by
// its owner, with the piece's place in the full tensor in the metadata.
void add_weights(RankFiles& out, nn::Transformer& model, optim::ParamOptimizer& opt,
                 const WritesFn& writes) {
  for (const auto& m : opt.checkpoint_masters()) {
    const bool own_chunk = opt.sharded() && !m.replicated && !m.duplicate;
    if (!own_chunk && !writes(m.name)) continue;
    const nn::Parameter& p = model.params().get(m.name);
    Piece piece = piece_of(m);
    if (!piece.is_block())
      piece.shape = p.value.shape();  // not tp-sharded: the local shape is the full one
    if (piece.metadata().empty()) {
      out.weights.push_back({m.name, m.values.reshape(p.value.shape())});
    } else {
      out.weights.push_back(
          {m.name, piece.whole_block() ? m.values.reshape(p.value.shape()) : m.values});
      out.weight_meta[m.name] = piece.metadata();
    }
  }
}

// Rank 0's files beside its weights: the router biases, the HF config, the
// trainer state and the run's config.
std::vector<std::string> write_common_files(const std::string& dir, nn::Transformer& model,
                                            const SaveRequest& req) {
  std::vector<NamedTensor> state;
  for (nn::MoeLayer* layer : model.moe_layers())
    state.push_back({router_bias_name(*layer), layer->bias()});
  write_safetensors(dir + "/" + kStateFile, state);
  std::ofstream f(dir + "/" + kHfConfigFile);
  f << hf_config(model.config(), model.moe_config()).dump(2) << "\n";
  std::ofstream t(dir + "/" + kTrainerFile);
  t << req.trainer_state.dump(2) << "\n";
  std::ofstream c(dir + "/" + kRunConfigFile);
  c << req.config_toml;
  f.flush();
  t.flush();
  c.flush();
  MOETRON_CHECK(f.good() && t.good() && c.good(), "writing checkpoint files into '", dir,
                "' failed");
  return {kStateFile, kHfConfigFile, kTrainerFile, kRunConfigFile};
}

}  // namespace

int64_t RankFiles::tensor_bytes() const {
  int64_t total = 0;
  for (const auto& w : weights) total += static_cast<int64_t>(w.tensor.nbytes());
  for (const auto& sl : slices) total += static_cast<int64_t>(sl.values.nbytes());
  return total;
}

RankFiles rank_files_to_write(int rank, nn::Transformer& model, optim::ParamOptimizer& opt,
                              const WritesFn& writes, const std::vector<optim::StateSlice>& extra) {
  RankFiles out;
  out.rank = rank;
  add_weights(out, model, opt, writes);
  // A tp block by the rank that writes its parameter's block; a sharded
  // optimizer's chunks by their ranks (once: see StateSlice::duplicate); a
  // replicated optimizer's state once, by rank 0.
  for (auto& sl : opt.state_slices()) {
    const bool own_chunk = opt.sharded() && !sl.replicated && !sl.duplicate;
    if (own_chunk || writes(sl.block_of ? sl.block_of->name : sl.name))
      out.slices.push_back(std::move(sl));
  }
  out.slices.insert(out.slices.end(), extra.begin(), extra.end());
  return out;
}

WrittenFiles write_rank_files(const std::string& dir, const RankFiles& files,
                              nn::Transformer& model, const SaveRequest& req) {
  WrittenFiles out;
  if (files.has_model_file()) {
    const std::string name = model_file(files.rank);
    out.checksums[name] = write_safetensors(dir + "/" + name, files.weights, files.weight_meta);
    out.names.push_back(name);
  }
  if (files.rank == 0) {
    for (auto& n : write_common_files(dir, model, req)) out.names.push_back(std::move(n));
  }
  const std::string name = optimizer_file(files.rank);
  out.checksums[name] = write_optimizer_slices(dir + "/" + name, files.slices);
  out.names.push_back(name);
  return out;
}

nlohmann::json checkpoint_manifest_state(int64_t step, int ranks,
                                         const std::vector<std::string>& model_files,
                                         const nlohmann::json& layout,
                                         const std::string& model_signature) {
  return {{"step", step},
          {"optimizer_ranks", ranks},
          {"model_files", model_files},
          {"layout", layout},
          {"model_signature", model_signature}};
}

nlohmann::json layout_of(const nlohmann::json& trainer_state) {
  nlohmann::json layout = nlohmann::json::object();
  for (const char* k : {"dp", "tp", "ep", "pp"}) {
    if (trainer_state.contains(k)) layout[k] = trainer_state[k];
  }
  return layout;
}

}  // namespace moetron::ckpt
