// Whisper-style audio encoder (issue 21): log-mel frames [B, T, n_mels] ->
// conv1d(n_mels -> d, kernel k, stride s1, padding k / 2) + GELU ->
// conv1d(d -> d, kernel k, stride s2, padding k / 2) + GELU -> + sinusoidal
// positions (Whisper's: sin over the first d / 2 channels, cos over the
// rest, timescales 1 .. 10000) -> non-causal blocks -> RMSNorm -> projector
// into the language model's width. N = conv1d_output_length of each conv in
// turn: ceil(T / 2) with Whisper's strides (1, 2), ceil(T / 4) with (2, 2).
//
// Parameters (ParameterSet passed in):
//   audio.conv1.weight [d, n_mels, k]   audio.conv1.bias [d]
//   audio.conv2.weight [d, d, k]        audio.conv2.bias [d]
//   audio.layers.{i}....  (as nn/block.h names them under "audio.layers.")
//   audio.norm.weight [d]
//   audio.projector.0.weight [d_lm, d]  audio.projector.2.weight [d_lm, d_lm]
// The features get no gradient. Host tensors (CPU and reference backends).
#pragma once

#include <string>
#include <vector>

#include "moetron/kernels/conv1d.h"
#include "moetron/nn/encoder_trunk.h"

namespace moetron::nn {

class AudioEncoder {
 public:
  AudioEncoder(const AudioConfig& cfg, int64_t d_lm, Precision prec, ParameterSet& params,
               const std::string& root = "audio.");

  // mel: f32 (or f64) [B, T, n_mels]. Returns tokens [B * N, d_lm].
  Tensor forward(kernels::Context& ctx, const Tensor& mel);
  // d_tokens: [B * N, d_lm]; every parameter's gradient accumulates.
  void backward(kernels::Context& ctx, const Tensor& d_tokens);
  void release();
  // Tokens of `frames` log-mel frames.
  int64_t tokens_for_frames(int64_t frames) const;
  const AudioConfig& config() const { return cfg_; }
  // This encoder's parameters in registration order (for the trainer's hooks).
  const std::vector<Parameter*>& parameters() const { return own_; }

 private:
  AudioConfig cfg_;
  Precision prec_;
  size_t first_param_;
  std::vector<Parameter*> own_;
  kernels::Conv1dArgs conv1_, conv2_;
  Parameter *w1_, *b1_, *w2_, *b2_;
  EncoderTrunk trunk_;
  Tensor mel_, pre1_, act1_, pre2_;
  // [B * N, d] sinusoidal positions of B items of N tokens.
  Tensor positions(kernels::Context& ctx, int64_t batch, int64_t tokens) const;
};

}  // namespace moetron::nn
