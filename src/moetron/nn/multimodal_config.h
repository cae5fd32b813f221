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
  // their row (LLaVA). Gated cross-attention (Flamingo) is built but not yet
  // wired into the language model (nn/cross_attention.h).
  std::string fusion = "prefix";
};

}  // namespace moetron::nn
