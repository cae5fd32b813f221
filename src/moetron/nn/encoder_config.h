// The modality encoders' shapes (nn/vision_encoder.h, nn/audio_encoder.h):
// plain structs like ModelConfig, read by nn/ to build the encoders and by
// train/ from TOML, where they are validated.
#pragma once

#include <cstdint>

#include "moetron/nn/model_config.h"

namespace moetron::nn {

// The transformer both encoders run over their tokens: non-causal pre-norm
// blocks (nn/block.h), dense SwiGLU FFN, no RoPE (absolute positions are
// added to the tokens), then a final RMSNorm.
struct EncoderTransformerConfig {
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t ffn_hidden = 688;
  double norm_eps = 1e-5;
  double init_std = 0.02;
};

// ViT-style patch encoder over images [B, C, H, W]: each p x p patch is a
// token, in row-major patch order. The position of patch (r, c) is the sum
// of row and column embeddings, tables sized for max_rows x max_cols patches,
// so square scenes and wide text lines share one encoder.
struct VisionConfig {
  EncoderTransformerConfig transformer;
  int64_t channels = 3;
  int64_t patch = 4;
  int64_t max_rows = 16;  // patches per image column (H / patch at most this)
  int64_t max_cols = 16;  // patches per image row (W / patch at most this)
};

// Whisper-style encoder over log-mel frames [B, T, n_mels]: conv1d(n_mels ->
// d, width conv_kernel, stride conv1_stride) + GELU, conv1d(d -> d, stride
// conv2_stride) + GELU (padding conv_kernel / 2 both), sinusoidal positions,
// then the transformer. Tokens: about T / (conv1_stride * conv2_stride)
// (Whisper: strides 1 and 2, T / 2).
struct AudioConfig {
  EncoderTransformerConfig transformer;
  int64_t n_mels = 80;
  int64_t conv_kernel = 3;
  int64_t conv1_stride = 1;
  int64_t conv2_stride = 2;
};

// The ModelConfig a Block of an encoder is built from (n_kv_heads = n_heads).
inline ModelConfig encoder_block_config(const EncoderTransformerConfig& e) {
  ModelConfig m;
  m.d_model = e.d_model;
  m.n_layers = e.n_layers;
  m.n_heads = e.n_heads;
  m.n_kv_heads = e.n_heads;
  m.ffn_hidden = e.ffn_hidden;
  m.norm_eps = e.norm_eps;
  m.init_std = e.init_std;
  m.max_seq_len = 1 << 30;  // the encoders bound their own token counts
  return m;
}

}  // namespace moetron::nn
