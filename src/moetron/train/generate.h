// Text generation and evaluation from a checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"
#include "moetron/train/config.h"

namespace moetron::train {

struct LoadedModel {
  Config cfg;
  std::unique_ptr<nn::Transformer> model;
};

// Reads DIR/moetron.toml and the weights (checksums verified), in fp32; a
// multimodal run's encoders (multimodal.enabled) are built and loaded too.
LoadedModel load_model(const std::string& checkpoint_dir);

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 1;
  int32_t stop_id = -1;  // stop when sampled (EOS)
};

// Throws naming the flag (--temperature, --top-k, --max-new-tokens) that is out of range.
void check_sample_options(const SampleOptions& opts);
// The next token from one row of V logits: the argmax with temperature 0,
// else drawn from the top_k most likely at `temperature` (one draw of rng).
int32_t pick_token(const float* logits, int64_t v, const SampleOptions& opts, PhiloxStream& rng);

// Continues `prompt` token by token (the context is cut to the model's
// max_seq_len); returns the new tokens only.
std::vector<int32_t> sample_tokens(kernels::Context& ctx, nn::Transformer& model,
                                   const std::vector<int32_t>& prompt, const SampleOptions& opts);

struct EvalResult {
  double loss = 0;  // mean next-token cross-entropy (nats)
  int64_t tokens = 0;
};
// Raw little-endian int32 ids from `tokens_path`, cut into rows of
// seq_len + 1 tokens (a shorter tail is dropped); max_rows > 0: only the
// first max_rows rows.
EvalResult evaluate_tokens(kernels::Context& ctx, nn::Transformer& model,
                           const std::string& tokens_path, int64_t seq_len, int64_t batch,
                           int64_t max_rows = 0);

}  // namespace moetron::train
