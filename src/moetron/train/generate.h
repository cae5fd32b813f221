// Text generation and evaluation from a checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"
#include "moetron/train/config.h"

namespace moetron::train {

struct LoadedModel {
  Config cfg;
  std::unique_ptr<nn::Transformer> model;
};

// Reads DIR/moetron.toml and the weights (checksums verified), in fp32.
LoadedModel load_model(const std::string& checkpoint_dir);

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 1;
  int32_t stop_id = -1;  // stop when sampled (EOS)
};

// Continues `prompt` token by token (the context is cut to the model's
// max_seq_len); returns the new tokens only.
std::vector<int32_t> sample_tokens(kernels::Context& ctx, nn::Transformer& model,
                                   const std::vector<int32_t>& prompt, const SampleOptions& opts);

struct EvalResult {
  double loss = 0;  // mean next-token cross-entropy (nats)
  int64_t tokens = 0;
};
// Raw little-endian int32 ids from `tokens_path`, cut into rows of
// seq_len + 1 tokens (a shorter tail is dropped).
EvalResult evaluate_tokens(kernels::Context& ctx, nn::Transformer& model,
                           const std::string& tokens_path, int64_t seq_len, int64_t batch);

}  // namespace moetron::train
