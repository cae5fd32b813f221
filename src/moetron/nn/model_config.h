// The model's shape and MoE options: read by nn/ to build the model and by
// train/ (config.h) from TOML, where they are validated.
#pragma once

#include <algorithm>
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
  // Hybrid attention ([attention] in TOML). A "local" layer attends to the
  // last `attention_window` positions (query included) plus the first
  // `attention_global_tokens` positions of the sequence, which themselves
  // attend to every position before them; a "global" layer is full causal.
  // `attention_layer_pattern` is a string of L (local) and G (global)
  // repeated over the layers ("LLLLLG": five local, then one global, as
  // Gemma 3); empty means every layer is local. Window 0: every layer is
  // full causal and the other two must be unset.
  int64_t attention_window = 0;
  int64_t attention_global_tokens = 0;
  std::string attention_layer_pattern;
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : d_model / n_heads; }
};

// Whether layer `i` uses the sliding window (and global tokens).
inline bool layer_is_local(const ModelConfig& m, int64_t i) {
  if (m.attention_window <= 0) return false;
  const std::string& p = m.attention_layer_pattern;
  return p.empty() || p[static_cast<size_t>(i) % p.size()] == 'L';
}

// The number of (query, key) pairs layer `i` scores over one causal
// sequence of `seq` tokens: seq (seq + 1) / 2 when global, about
// seq (window + global_tokens) when local.
inline double layer_attended_pairs(const ModelConfig& m, int64_t i, int64_t seq) {
  const auto s = static_cast<double>(seq);
  if (!layer_is_local(m, i)) return s * (s + 1) / 2;
  double pairs = 0;
  const int64_t w = m.attention_window, g = m.attention_global_tokens;
  for (int64_t p = 0; p < seq; ++p) {
    // Keys [max(0, p - w + 1), p] plus the global keys [0, g) below that
    // range; a global query (p < g) sees every key up to itself.
    const int64_t lo = p < g ? 0 : std::max<int64_t>(0, p - w + 1);
    pairs += static_cast<double>(p - lo + 1 + std::min(lo, g));
  }
  return pairs;
}

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
  // Modality-aware routing (nn/modality_routing.h). Tokens carry a modality
  // id in [0, num_modalities) (0 text, 1 image, 2 audio); the defaults keep
  // today's router.
  std::string modality_routing = "shared";  // shared | prior | partitioned
  int64_t num_modalities = 3;
  std::string modality_experts;  // partitioned: "4,2,2" owned per modality; empty: E / M each
  double modality_local_entropy_coef = 0.0;        // LIMoE local entropy (pushed down); 0: off
  double modality_global_entropy_coef = 0.0;       // LIMoE global entropy hinge; 0: off
  double modality_global_entropy_threshold = 0.0;  // nats
  int64_t modality_realloc_every = 0;              // partitioned adaptive allocation; 0: off
  double modality_realloc_hysteresis = 0.1;
  int64_t modality_min_experts = 1;  // a modality never owns fewer
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
