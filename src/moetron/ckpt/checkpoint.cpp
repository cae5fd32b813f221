#include "moetron/ckpt/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "moetron/ckpt/safetensors.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/kernels/elementwise.h"

namespace moetron::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kStateFile = "state.safetensors";
constexpr const char* kTrainerFile = "trainer.json";

std::string bias_name(const nn::MoeLayer& layer) {
  return layer.prefix() + "block_sparse_moe.e_score_correction_bias";
}

// Steps of the complete-looking checkpoint directories (step-N), newest first.
std::vector<std::pair<int64_t, std::string>> checkpoint_dirs(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    const std::string digits = name.substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;  // skips .tmp-*
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
  return {{"architectures", {"MixtralForCausalLM"}},
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
}

namespace {

std::string optimizer_file(int rank) { return "optimizer-rank-" + std::to_string(rank) + ".safetensors"; }
std::string model_file(int rank) {
  return rank == 0 ? kModelFile : "model-rank-" + std::to_string(rank) + ".safetensors";
}

// Every rank learns whether every rank succeeded; a failure anywhere throws
// everywhere (naming the first failing rank), so no rank publishes or waits alone.
void agree(comm::Communicator& world, const std::string& error, const std::string& what) {
  Tensor flag = Tensor::empty({1}, DType::i32, MemTag::comm);
  flag.data<int32_t>()[0] = error.empty() ? -1 : world.rank();
  if (world.size() > 1) world.allreduce(flag, comm::ReduceOp::max);
  if (!error.empty()) MOETRON_FAIL(error);
  MOETRON_CHECK(flag.data<int32_t>()[0] < 0, what, " failed on rank ", flag.data<int32_t>()[0]);
}

void broadcast_string(comm::Communicator& world, std::string& s) {
  Tensor len = Tensor::empty({1}, DType::i64, MemTag::comm);
  len.data<int64_t>()[0] = static_cast<int64_t>(s.size());
  world.broadcast(len, 0);
  Tensor bytes = Tensor::zeros({std::max<int64_t>(len.data<int64_t>()[0], 1)}, DType::u8, MemTag::comm);
  std::copy(s.begin(), s.end(), bytes.data<uint8_t>());
  world.broadcast(bytes, 0);
  s.assign(reinterpret_cast<const char*>(bytes.data<uint8_t>()), static_cast<size_t>(len.data<int64_t>()[0]));
}

void write_optimizer_slices(const std::string& path, std::vector<optim::StateSlice> slices) {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> meta;
  for (const auto& sl : slices) {
    tensors.push_back({sl.name, sl.values});
    meta[sl.name] = std::to_string(sl.offset) + "," + std::to_string(sl.total);
  }
  write_safetensors(path, tensors, meta);
}

}  // namespace

void save_checkpoint(const std::string& run_dir, int64_t step, nn::Transformer& model,
                     optim::ParamOptimizer& opt, const nlohmann::json& trainer_state,
                     const std::string& config_toml, int64_t keep, comm::Communicator* world_ptr,
                     const std::vector<optim::StateSlice>& extra,
                     const std::function<bool(const std::string&)>& writes_fn) {
  std::unique_ptr<comm::Communicator> local;
  if (!world_ptr) local = comm::make_local_communicator();
  comm::Communicator& world = world_ptr ? *world_ptr : *local;
  const auto writes = [&](const std::string& name) { return writes_fn ? writes_fn(name) : world.rank() == 0; };
  const std::string final_dir = checkpoint_dir(run_dir, step);
  std::vector<NamedTensor> weights;  // fp32 masters: resume is exact
  for (const auto& m : opt.full_masters()) {  // collective
    if (writes(m.name)) weights.push_back({m.name, m.tensor});
  }
  // Which ranks write a model file: rank 0 always (the Hugging Face file).
  Tensor writers = Tensor::zeros({world.size()}, DType::i32, MemTag::comm);
  writers.data<int32_t>()[world.rank()] = world.rank() == 0 || !weights.empty();
  if (world.size() > 1) world.allreduce(writers, comm::ReduceOp::sum);
  std::unique_ptr<StagedDir> staged;
  std::string staging, error;
  if (world.rank() == 0) {
    try {
      staged = std::make_unique<StagedDir>(final_dir);
      staging = staged->staging_path();
      write_safetensors(staged->file(kModelFile), weights, {{"format", "pt"}});
      std::vector<NamedTensor> state;
      for (nn::MoeLayer* layer : model.moe_layers()) state.push_back({bias_name(*layer), layer->bias()});
      write_safetensors(staged->file(kStateFile), state);
      std::ofstream f(staged->file("config.json"));
      f << hf_config(model.config(), model.moe_config()).dump(2) << "\n";
      std::ofstream t(staged->file(kTrainerFile));
      t << trainer_state.dump(2) << "\n";
      std::ofstream c(staged->file("moetron.toml"));
      c << config_toml;
      MOETRON_CHECK(f.good() && t.good() && c.good(), "writing checkpoint '", final_dir, "' failed");
    } catch (const Error& e) {
      error = e.what();
      staging.clear();
    }
  }
  if (world.size() > 1) broadcast_string(world, staging);  // empty: rank 0 failed
  if (!error.empty()) MOETRON_FAIL(error);
  MOETRON_CHECK(!staging.empty(), "rank 0 could not stage checkpoint '", final_dir, "'");
  try {
    // A replicated optimizer's state is stored once, by rank 0.
    if (world.rank() > 0 && !weights.empty()) {
      write_safetensors(staging + "/" + model_file(world.rank()), weights, {{"format", "pt"}});
    }
    std::vector<optim::StateSlice> slices;
    for (auto& sl : opt.state_slices()) {
      if ((opt.sharded() && !sl.replicated) || writes(sl.name)) slices.push_back(std::move(sl));
    }
    slices.insert(slices.end(), extra.begin(), extra.end());
    write_optimizer_slices(staging + "/" + optimizer_file(world.rank()), std::move(slices));
  } catch (const Error& e) {
    error = e.what();
  }
  agree(world, error, str_cat("writing checkpoint '", final_dir, "'"));
  if (world.rank() == 0) {
    try {
      std::vector<std::string> files = {kStateFile, "config.json", kTrainerFile, "moetron.toml"};
      nlohmann::json model_files = nlohmann::json::array();
      for (int r = 0; r < world.size(); ++r) {
        if (writers.data<int32_t>()[r]) model_files.push_back(model_file(r));
      }
      for (const auto& f : model_files) files.push_back(f.get<std::string>());
      for (int r = 0; r < world.size(); ++r) files.push_back(optimizer_file(r));
      write_manifest(staged->staging_path(), files,
                     {{"step", step}, {"optimizer_ranks", world.size()}, {"model_files", model_files}});
      staged->commit();
      // Prune only after the new checkpoint is durable.
      const auto dirs = checkpoint_dirs(run_dir);
      for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < dirs.size(); ++i) {
        remove_tree(dirs[i].second);
      }
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

// Fills each of the optimizer's slices from the slices the checkpoint's ranks
// wrote, whatever the dp size was; every element must be found exactly once.
void load_optimizer_slices(const std::string& dir, int64_t saved_ranks, std::vector<optim::StateSlice> slices) {
  std::vector<int64_t> filled(slices.size(), 0);
  for (int64_t r = 0; r < saved_ranks; ++r) {
    const std::string path = dir + "/" + optimizer_file(static_cast<int>(r));
    SafetensorsReader file(path);
    for (size_t i = 0; i < slices.size(); ++i) {
      const optim::StateSlice& sl = slices[i];
      if (!file.contains(sl.name)) continue;
      const auto it = file.metadata().find(sl.name);
      MOETRON_CHECK(it != file.metadata().end(), "'", path, "' has no element range for '", sl.name, "'");
      const int64_t offset = std::stoll(it->second), total = std::stoll(it->second.substr(it->second.find(',') + 1));
      MOETRON_CHECK(total == sl.total, "'", path, "': optimizer tensor '", sl.name, "' has ", total,
                    " elements, the model expects ", sl.total, " (saved from another model?)");
      const Tensor saved = file.view(sl.name);
      const int64_t lo = std::max(offset, sl.offset);
      const int64_t hi = std::min(offset + saved.numel(), sl.offset + sl.values.numel());
      if (lo >= hi) continue;
      // Saved in the live dtype: copied bit for bit; saved with another
      // optim.moment_dtype: converted (rounded to nearest even, or widened).
      const Tensor dst = sl.values.slice(lo - sl.offset, hi - sl.offset), src = saved.slice(lo - offset, hi - offset);
      if (src.dtype() == dst.dtype()) {
        dst.copy_from(src);
      } else {
        kernels::Context conv(kernels::Backend::reference);
        kernels::convert(conv, src, dst);
      }
      filled[i] += hi - lo;
    }
  }
  for (size_t i = 0; i < slices.size(); ++i) {
    if (!slices[i].required && filled[i] == 0) {
      std::cerr << "notice: checkpoint '" << dir << "' has no '" << slices[i].name << "' for this layout; starting it from zero\n";
      continue;
    }
    MOETRON_CHECK(filled[i] == slices[i].values.numel(), "checkpoint '", dir, "' holds ", filled[i], " of the ",
                  slices[i].values.numel(), " elements of optimizer tensor '", slices[i].name,
                  "' this rank needs (saved with another optimizer?)");
  }
}

}  // namespace

nlohmann::json load_checkpoint(const std::string& dir, nn::Transformer& model,
                               optim::ParamOptimizer* opt, const std::vector<optim::StateSlice>& extra) {
  const nlohmann::json manifest = verify_manifest(dir);
  // Parameters by name from whichever model file holds them: a checkpoint of
  // any layout loads into any other.
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  for (const auto& f : manifest.value("model_files", nlohmann::json::array({kModelFile}))) {
    files.push_back(std::make_unique<SafetensorsReader>(dir + "/" + f.get<std::string>()));
  }
  for (const auto& p : model.params().all()) {
    SafetensorsReader* weights = nullptr;
    for (auto& f : files) {
      if (f->contains(p->name)) weights = f.get();
    }
    MOETRON_CHECK(weights, "checkpoint '", dir, "' has no tensor '", p->name, "'");
    if (opt) {
      opt->load_master(p->name, weights->view(p->name));
    } else if (p->sharded()) {  // a tp shard: its block of the full tensor
      Tensor full = Tensor::empty(p->shard.full, p->value.dtype(), MemTag::workspace);
      weights->read_into(p->name, full);
      nn::copy_shard(*p, full, p->value);
    } else {
      weights->read_into(p->name, p->value);
    }
  }
  if (opt) {
    std::vector<optim::StateSlice> slices = opt->state_slices();
    slices.insert(slices.end(), extra.begin(), extra.end());
    load_optimizer_slices(dir, manifest.value("optimizer_ranks", int64_t{1}), std::move(slices));
    opt->finish_state_load();
  }
  SafetensorsReader state(dir + "/" + kStateFile);
  for (nn::MoeLayer* layer : model.moe_layers()) {
    if (state.contains(bias_name(*layer))) state.read_into(bias_name(*layer), layer->bias());
  }
  std::ifstream f(dir + "/" + kTrainerFile);
  return nlohmann::json::parse(f);
}

}  // namespace moetron::ckpt
