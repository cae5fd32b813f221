#include "moetron/ckpt/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "moetron/ckpt/safetensors.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"

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

void save_checkpoint(const std::string& run_dir, int64_t step, nn::Transformer& model,
                     optim::Optimizer& opt, const nlohmann::json& trainer_state,
                     const std::string& config_toml, int64_t keep) {
  const std::string final_dir = checkpoint_dir(run_dir, step);
  StagedDir staged(final_dir);
  std::vector<NamedTensor> weights;
  for (const auto& p : model.params().all()) {
    weights.push_back({p->name, opt.master(p->name)});  // fp32 master: resume is exact
  }
  write_safetensors(staged.file(kModelFile), weights, {{"format", "pt"}});
  std::vector<NamedTensor> state;
  for (auto& s : opt.state()) state.push_back({s.name, s.tensor});
  for (nn::MoeLayer* layer : model.moe_layers()) state.push_back({bias_name(*layer), layer->bias()});
  write_safetensors(staged.file(kStateFile), state);
  {
    std::ofstream f(staged.file("config.json"));
    f << hf_config(model.config(), model.moe_config()).dump(2) << "\n";
    std::ofstream t(staged.file(kTrainerFile));
    t << trainer_state.dump(2) << "\n";
    std::ofstream c(staged.file("moetron.toml"));
    c << config_toml;
    MOETRON_CHECK(f.good() && t.good() && c.good(), "writing checkpoint '", final_dir, "' failed");
  }
  write_manifest(staged.staging_path(),
                 {kModelFile, kStateFile, "config.json", kTrainerFile, "moetron.toml"},
                 {{"step", step}});
  staged.commit();
  // Prune only after the new checkpoint is durable.
  const auto dirs = checkpoint_dirs(run_dir);
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < dirs.size(); ++i) {
    remove_tree(dirs[i].second);
  }
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

nlohmann::json load_checkpoint(const std::string& dir, nn::Transformer& model,
                               optim::Optimizer* opt) {
  verify_manifest(dir);
  SafetensorsReader weights(dir + "/" + kModelFile);
  for (const auto& p : model.params().all()) {
    MOETRON_CHECK(weights.contains(p->name), "checkpoint '", dir, "' has no tensor '", p->name, "'");
    weights.read_into(p->name, p->value);
    if (opt) {
      const Tensor master = opt->master(p->name);
      if (master.raw() != p->value.raw()) weights.read_into(p->name, master);
    }
  }
  SafetensorsReader state(dir + "/" + kStateFile);
  if (opt) {
    for (auto& s : opt->state()) {
      MOETRON_CHECK(state.contains(s.name), "checkpoint '", dir, "' has no optimizer tensor '", s.name,
                    "' (saved with another optimizer?)");
      state.read_into(s.name, s.tensor);
    }
  }
  for (nn::MoeLayer* layer : model.moe_layers()) {
    if (state.contains(bias_name(*layer))) state.read_into(bias_name(*layer), layer->bias());
  }
  std::ifstream f(dir + "/" + kTrainerFile);
  return nlohmann::json::parse(f);
}

}  // namespace moetron::ckpt
