#include "moetron/ckpt/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "moetron/ckpt/pieces.h"
#include "moetron/ckpt/rank_files.h"
#include "moetron/ckpt/safetensors.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/kernels/elementwise.h"

namespace moetron::ckpt {

namespace fs = std::filesystem;

namespace {

// Steps of the complete-looking checkpoint directories (step-N), newest first.
std::vector<std::pair<int64_t, std::string>> checkpoint_dirs(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    const std::string digits = name.substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit))
      continue;  // skips .tmp-*
    out.emplace_back(std::stoll(digits), e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

}  // namespace

std::string checkpoint_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / ("step-" + std::to_string(step))).string();
}

nlohmann::json hf_config(const nn::ModelConfig& m, const nn::MoeConfig& e) {
  nlohmann::json c = {{"architectures", {"MixtralForCausalLM"}},
                      {"model_type", "mixtral"},
                      {"vocab_size", m.vocab_size},
                      {"hidden_size", m.d_model},
                      {"intermediate_size", e.num_experts > 0 ? e.expert_hidden : m.ffn_hidden},
                      {"num_hidden_layers", m.n_layers},
                      {"num_attention_heads", m.n_heads},
                      {"num_key_value_heads", m.n_kv_heads},
                      {"head_dim", m.resolved_head_dim()},
                      {"max_position_embeddings", m.max_seq_len},
                      {"rms_norm_eps", m.norm_eps},
                      {"rope_theta", m.rope_theta},
                      {"num_local_experts", e.num_experts},
                      {"num_experts_per_tok", e.top_k},
                      {"router_aux_loss_coef", e.aux_loss_coef},
                      {"tie_word_embeddings", m.tie_embeddings},
                      {"sliding_window", nullptr},
                      {"hidden_act", "silu"},
                      {"torch_dtype", "float32"}};
  if (m.attention_window > 0) {
    // Hugging Face's names: one window for the local layers, and which
    // layers are local ("sliding_attention") or full ("full_attention").
    c["sliding_window"] = m.attention_window;
    nlohmann::json types = nlohmann::json::array();
    for (int64_t i = 0; i < m.n_layers; ++i)
      types.push_back(nn::layer_is_local(m, i) ? "sliding_attention" : "full_attention");
    c["layer_types"] = types;
    // No Hugging Face field for Longformer-style global tokens in a decoder.
    if (m.attention_global_tokens > 0) c["moetron_global_tokens"] = m.attention_global_tokens;
  }
  return c;
}

namespace {

// Every rank learns whether every rank succeeded; a failure anywhere throws
// everywhere (naming the first failing rank), so no rank publishes or waits alone.
void agree(comm::Communicator& world, const std::string& error, const std::string& what) {
  Tensor flag = Tensor::empty({1}, DType::i32, MemTag::comm);
  flag.data<int32_t>()[0] = error.empty() ? -1 : world.rank();
  if (world.size() > 1) world.allreduce(flag, comm::ReduceOp::max);
  if (!error.empty()) MOETRON_FAIL(error);
  MOETRON_CHECK(flag.data<int32_t>()[0] < 0, what, " failed on rank ", flag.data<int32_t>()[0]);
}

// The model signature a checkpoint's manifest records (nullopt: unreadable
// or written before signatures; such a checkpoint is never pruned).
std::optional<std::string> model_signature_of(const std::string& dir) {
  try {
    std::ifstream f(dir + "/" + kManifestName);
    const nlohmann::json m = nlohmann::json::parse(f);
    const auto& st = m.at("state");
    if (!st.contains("model_signature")) return std::nullopt;
    return st.at("model_signature").get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Rank 0: the manifest over every rank's files, the atomic commit, then
// pruning to req.keep checkpoints (only once the new one is durable).
void publish(StagedDir& staged, const SaveRequest& req, int world_size, const Tensor& writers) {
  std::vector<std::string> files = {kStateFile, kHfConfigFile, kTrainerFile, kRunConfigFile};
  std::vector<std::string> model_files;
  for (int r = 0; r < world_size; ++r) {
    if (writers.data<int32_t>()[r]) model_files.push_back(model_file(r));
  }
  files.insert(files.end(), model_files.begin(), model_files.end());
  for (int r = 0; r < world_size; ++r) files.push_back(optimizer_file(r));
  write_manifest(staged.staging_path(), files,
                 checkpoint_manifest_state(req.step, world_size, model_files,
                                           layout_of(req.trainer_state), req.model_signature));
  staged.commit();
  prune_checkpoints(req.run_dir, req.keep, req.model_signature);
}

}  // namespace

void prune_checkpoints(const std::string& run_dir, int64_t keep,
                       const std::string& model_signature) {
  // Only checkpoints of this model (never another model's, whatever its step).
  int64_t kept = 0;
  for (const auto& [step, dir] : checkpoint_dirs(run_dir)) {
    if (model_signature_of(dir) != model_signature) continue;
    if (++kept > std::max<int64_t>(keep, 1)) remove_tree(dir);
  }
  remove_dead_staging_dirs(run_dir);
}

void save_checkpoint(const SaveRequest& req, nn::Transformer& model, optim::ParamOptimizer& opt) {
  std::unique_ptr<comm::Communicator> local;
  if (!req.world) local = comm::make_local_communicator();
  comm::Communicator& world = req.world ? *req.world : *local;
  const WritesFn writes = [&](const std::string& name) {
    return req.writes ? req.writes(name) : world.rank() == 0;
  };
  const std::string final_dir = checkpoint_dir(req.run_dir, req.step);
  const RankFiles files = rank_files_to_write(world.rank(), model, opt, writes, req.extra);
  // Which ranks write a model file: rank 0 always (model.safetensors: at one
  // rank the Hugging Face file; `moetron export` assembles one from any layout).
  Tensor writers = Tensor::zeros({world.size()}, DType::i32, MemTag::comm);
  writers.data<int32_t>()[world.rank()] = files.has_model_file();
  if (world.size() > 1) world.allreduce(writers, comm::ReduceOp::sum);
  std::unique_ptr<StagedDir> staged;
  std::string staging, error;
  if (world.rank() == 0) {
    try {
      staged = std::make_unique<StagedDir>(final_dir);
      staging = staged->staging_path();
    } catch (const Error& e) {
      error = e.what();
      staging.clear();
    }
  }
  comm::broadcast_string(world, staging);  // empty: rank 0 failed
  if (!error.empty()) MOETRON_FAIL(error);
  MOETRON_CHECK(!staging.empty(), "rank 0 could not stage checkpoint '", final_dir, "'");
  try {
    if (req.before_write) req.before_write(staging);
    write_rank_files(staging, files, model, req);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(world, error, str_cat("writing checkpoint '", final_dir, "'"));
  if (world.rank() == 0) {
    try {
      publish(*staged, req, world.size(), writers);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(world, world.rank() == 0 ? error : "", str_cat("publishing checkpoint '", final_dir, "'"));
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir,
                                             std::vector<std::string>* warnings,
                                             std::vector<std::string>* skipped) {
  for (const auto& [step, dir] : checkpoint_dirs(run_dir)) {
    try {
      verify_manifest(dir);
      return dir;
    } catch (const Error& e) {
      if (warnings) warnings->push_back(str_cat("skipping checkpoint '", dir, "': ", e.what()));
      if (skipped) skipped->push_back(dir);
    }
  }
  return std::nullopt;
}

std::string resolve_checkpoint_dir(const std::string& path) {
  if (fs::exists(fs::path(path) / kManifestName)) return path;
  MOETRON_CHECK(fs::is_directory(fs::path(path) / "checkpoints"), "'", path,
                "' is neither a checkpoint (no ", kManifestName,
                ") nor a run directory (no checkpoints/)");
  std::vector<std::string> warnings;
  const auto dir = latest_checkpoint(path, &warnings);
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  MOETRON_CHECK(dir.has_value(), "run directory '", path, "' has no complete checkpoint");
  std::cerr << "using " << *dir << "\n";
  return *dir;
}

std::vector<std::string> remove_dead_staging_dirs(const std::string& run_dir) {
  std::vector<std::string> removed;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.find(".tmp-");
    if (!name.starts_with("step-") || at == std::string::npos) continue;
    const std::string digits = name.substr(at + 5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    const pid_t pid = static_cast<pid_t>(std::stoll(digits));
    // Alive (or not ours to signal): another process may still be writing it.
    if (pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM)) continue;
    remove_tree(e.path().string());
    removed.push_back(e.path().string());
  }
  return removed;
}

std::string quarantine_checkpoint(const std::string& dir) {
  std::string target = dir + ".corrupt";
  for (int k = 1; fs::exists(target); ++k) target = dir + ".corrupt-" + std::to_string(k);
  fs::rename(dir, target);
  return target;
}

int64_t checkpoint_step(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  MOETRON_CHECK(name.rfind("step-", 0) == 0, "'", dir, "' is not a step-N checkpoint directory");
  return std::stoll(name.substr(5));
}

namespace {

// Fills each of the optimizer's slices from the pieces the checkpoint's ranks
// wrote, whatever their dp and tp were; every element must be found exactly once.
void load_optimizer_slices(const std::string& dir, int64_t saved_ranks,
                           std::vector<optim::StateSlice> slices) {
  std::vector<int64_t> filled(slices.size(), 0);
  for (int64_t r = 0; r < saved_ranks; ++r) {
    const std::string path = dir + "/" + optimizer_file(static_cast<int>(r));
    SafetensorsReader file(path);
    for (size_t i = 0; i < slices.size(); ++i) {
      const optim::StateSlice& sl = slices[i];
      if (!file.contains(sl.name)) continue;
      const auto it = file.metadata().find(sl.name);
      MOETRON_CHECK(it != file.metadata().end(), "'", path, "' has no element range for '", sl.name,
                    "'");
      const Tensor saved = file.view(sl.name);
      const Piece piece =
          Piece::parse(it->second, saved.shape(), "'" + path + "', tensor '" + sl.name + "'");
      const Piece want = piece_of(sl);
      MOETRON_CHECK(piece.total == want.total, "'", path, "': optimizer tensor '", sl.name,
                    "' has ", piece.total, " elements, the model expects ", want.total,
                    " (saved from another model?)");
      // Saved in the live dtype: copied bit for bit; saved with another
      // optim.moment_dtype: converted (rounded to nearest even, or widened).
      filled[i] += copy_overlap(piece, saved, want, sl.values);
    }
  }
  for (size_t i = 0; i < slices.size(); ++i) {
    if (!slices[i].required && filled[i] == 0) {
      std::cerr << "notice: checkpoint '" << dir << "' has no '" << slices[i].name
                << "' for this layout; starting it from zero\n";
      continue;
    }
    MOETRON_CHECK(filled[i] == slices[i].values.numel(), "checkpoint '", dir, "' holds ", filled[i],
                  " of the ", slices[i].values.numel(), " elements of optimizer tensor '",
                  slices[i].name,
                  "' this rank needs (saved with another optimizer, or another "
                  "optim.moment_dtype: 8-bit state is stored as '.q8' codes and scales)");
  }
}

}  // namespace

namespace {

// load_weights after the manifest was verified (hashing every file is the
// cost of a load, so it happens once).
void load_verified_weights(const std::string& dir, const nlohmann::json& manifest,
                           nn::Transformer& model, optim::ParamOptimizer* opt) {
  // Parameters by name from whichever model files hold their pieces: a
  // checkpoint of any layout loads into any other.
  std::vector<std::string> paths;
  for (const auto& f : manifest.value("model_files", nlohmann::json::array({kModelFile}))) {
    paths.push_back(dir + "/" + f.get<std::string>());
  }
  const PieceIndex weights(paths);
  for (const auto& p : model.params().all()) {
    MOETRON_CHECK(weights.contains(p->name), "checkpoint '", dir, "' has no tensor '", p->name,
                  "'");
    const Shape full = p->sharded() ? p->shard.full : p->value.shape();
    const Piece want = p->sharded()
                           ? Piece::block(full, p->shard.row0, p->shard.col0, p->value.shape())
                           : Piece::whole(p->value.numel());
    Tensor local = Tensor::empty(p->value.shape(), weights.dtype(p->name), MemTag::workspace);
    weights.read(p->name, full, want, local);
    if (opt) {
      opt->load_master(p->name, local);
    } else {
      kernels::Context conv(kernels::Backend::reference);
      kernels::convert(conv, local, p->value);
    }
  }
  SafetensorsReader state(dir + "/" + kStateFile);
  for (nn::MoeLayer* layer : model.moe_layers()) {
    if (state.contains(router_bias_name(*layer)))
      state.read_into(router_bias_name(*layer), layer->bias());
  }
}

}  // namespace

void load_weights(const std::string& dir, nn::Transformer& model, optim::ParamOptimizer* opt) {
  load_verified_weights(dir, verify_manifest(dir), model, opt);
}

nlohmann::json load_checkpoint(const std::string& dir, nn::Transformer& model,
                               optim::ParamOptimizer* opt,
                               const std::vector<optim::StateSlice>& extra) {
  const nlohmann::json manifest = verify_manifest(dir);
  load_verified_weights(dir, manifest, model, opt);
  if (opt) {
    std::vector<optim::StateSlice> slices = opt->state_slices();
    slices.insert(slices.end(), extra.begin(), extra.end());
    load_optimizer_slices(dir, manifest.value("optimizer_ranks", int64_t{1}), std::move(slices));
    opt->finish_state_load();
  }
  std::ifstream f(dir + "/" + kTrainerFile);
  return nlohmann::json::parse(f);
}

}  // namespace moetron::ckpt
