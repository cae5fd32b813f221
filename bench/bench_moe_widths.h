// configs/bench-moe.toml's widths, for the benchmarks that build the model
// directly rather than from the config (long sequences, memory, context
// parallelism): V 8192, D 512, 8 layers, 8 heads (= kv heads), dense FFN
// 1408, 8 experts top-2 of hidden 1024; sequences up to `max_seq_len`.
#pragma once

#include <cstdint>

#include "moetron/nn/model_config.h"

namespace moetron::bench {

inline void set_bench_moe_widths(nn::ModelConfig& m, nn::MoeConfig& e, int64_t max_seq_len) {
  m.vocab_size = 8192;
  m.d_model = 512;
  m.n_layers = 8;
  m.n_heads = 8;
  m.n_kv_heads = 8;
  m.ffn_hidden = 1408;
  m.max_seq_len = max_seq_len;
  e.num_experts = 8;
  e.top_k = 2;
  e.expert_hidden = 1024;
}

}  // namespace moetron::bench
