// The multimodal model's shape ([vision], [audio] and [multimodal] in TOML,
// validated by train/config.cpp): the two encoders and how their tokens
// reach the language model.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/nn/encoder_config.h"

namespace moetron::nn {

struct MultimodalModelConfig {
  bool enabled = false;
  VisionConfig vision;
  AudioConfig audio;
  // "prefix": media tokens replace the embeddings of the first positions of
  // their row (LLaVA). "cross_attention": a gated cross-attention layer
  // (nn/cross_attention.h, Flamingo) before every cross_attention_every-th
  // language-model block (blocks i with i % k == k - 1) reads the row's
  // media tokens; rows carry no media positions. "both": the two at once.
  std::string fusion = "prefix";
  int64_t cross_attention_every = 1;

  bool prefix_fusion() const { return fusion == "prefix" || fusion == "both"; }
  bool cross_attention() const { return fusion == "cross_attention" || fusion == "both"; }
  // Whether language-model block `layer` has a cross-attention layer before it.
  bool cross_attention_at(int64_t layer) const {
    return enabled && cross_attention() && cross_attention_every > 0 &&
           layer % cross_attention_every == cross_attention_every - 1;
  }
};

}  // namespace moetron::nn
