// The model's shape and MoE options: read by nn/ to build the model and by
// train/ (config.h) from TOML, where they are validated.
#pragma once

#include <cstdint>
#include <string>

namespace moetron::nn {

struct ModelConfig {
  int64_t vocab_size = 8192;
  int64_t d_model = 512;
  int64_t n_layers = 8;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 8;
  int64_t head_dim = 0;       // 0: d_model / n_heads
  int64_t ffn_hidden = 1408;  // dense SwiGLU layers
  int64_t max_seq_len = 512;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  double init_std = 0.02;
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : d_model / n_heads; }
};

struct MoeConfig {
  int64_t num_experts = 8;  // 0: every FFN is dense
  int64_t top_k = 2;
  int64_t expert_hidden = 1024;
  int64_t every = 1;               // every n-th layer (after the dense ones) is MoE
  int64_t first_dense_layers = 0;  // leading layers kept dense
  int64_t shared_experts = 0;
  int64_t shared_expert_hidden = 0;      // 0: expert_hidden
  std::string router_score = "softmax";  // softmax (Mixtral) | sigmoid (DeepSeek-V3)
  bool renormalize = true;
  double aux_loss_coef = 1e-2;    // Switch load-balancing loss; 0 disables
  double z_loss_coef = 1e-3;      // router z-loss; 0 disables
  double bias_update_rate = 0.0;  // aux-loss-free bias step gamma; 0 disables
  double capacity_factor = 0.0;   // 0: dropless
};

// Expert parallelism: the routed experts are cut into `size` equal
// contiguous ranges and this rank holds range `rank` (experts
// [rank * E / size, (rank + 1) * E / size)). Parameters keep their global
// names, so every layout initialises and checkpoints the same tensors.
struct ExpertParallel {
  int64_t size = 1;
  int64_t rank = 0;
};

// Whether layer `i` has a routed-MoE FFN (else a dense SwiGLU).
inline bool layer_is_moe(const MoeConfig& e, int64_t i) {
  return e.num_experts > 0 && i >= e.first_dense_layers &&
         (i - e.first_dense_layers) % e.every == 0;
}

}  // namespace moetron::nn
