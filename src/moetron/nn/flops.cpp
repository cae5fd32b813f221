#include "moetron/nn/flops.h"

namespace moetron::nn {

namespace {

double layer_gemm_params(const ModelConfig& m, const MoeConfig& e, int64_t i) {
  const auto d = static_cast<double>(m.d_model);
  const auto hd = static_cast<double>(m.resolved_head_dim());
  double total = d * hd * static_cast<double>(2 * m.n_heads + 2 * m.n_kv_heads);
  if (layer_is_moe(e, i)) {
    const int64_t shared_hidden =
        (e.shared_expert_hidden > 0 ? e.shared_expert_hidden : e.expert_hidden) * e.shared_experts;
    total += d * static_cast<double>(e.num_experts);  // router
    total += 3.0 * d * static_cast<double>(e.top_k * e.expert_hidden + shared_hidden);
  } else {
    total += 3.0 * d * static_cast<double>(m.ffn_hidden);
  }
  return total;
}

}  // namespace

double active_gemm_params(const ModelConfig& m, const MoeConfig& e) {
  double total = static_cast<double>(m.vocab_size * m.d_model);  // LM head
  for (int64_t i = 0; i < m.n_layers; ++i) total += layer_gemm_params(m, e, i);
  return total;
}

namespace {

// Keys per token as PaLM counts them: S for a causal layer (the triangle
// twice), twice the mean visible keys for a local one.
double counted_keys_per_token(const ModelConfig& m, int64_t i, int64_t seq_len) {
  if (!layer_is_local(m, i)) return static_cast<double>(seq_len);
  return 2.0 * layer_attended_pairs(m, i, seq_len) / static_cast<double>(seq_len);
}

double attention_flops_per_token(const ModelConfig& m, int64_t i, int64_t seq_len) {
  return 12.0 * static_cast<double>(m.n_heads * m.resolved_head_dim()) *
         counted_keys_per_token(m, i, seq_len);
}

}  // namespace

double layer_flops_per_token(const ModelConfig& m, const MoeConfig& e, int64_t i, int64_t seq_len) {
  return 6.0 * layer_gemm_params(m, e, i) + attention_flops_per_token(m, i, seq_len);
}

double head_flops_per_token(const ModelConfig& m) {
  return 6.0 * static_cast<double>(m.vocab_size * m.d_model);
}

double model_flops_per_token(const ModelConfig& m, const MoeConfig& e, int64_t seq_len) {
  double attention = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) attention += attention_flops_per_token(m, i, seq_len);
  return 6.0 * active_gemm_params(m, e) + attention;
}

}  // namespace moetron::nn
