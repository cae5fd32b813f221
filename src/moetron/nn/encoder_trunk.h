// What the vision and audio encoders share after their own token embedding:
// non-causal transformer blocks (nn/block.h with BlockOptions: names
// `root` + "layers.{i}.", every token sees every token of its item, no
// RoPE), a final RMSNorm (`root` + "norm.weight") and the projector into the
// language model's width (`root` + "projector.{0,2}.weight").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moetron/nn/block.h"
#include "moetron/nn/encoder_config.h"
#include "moetron/nn/projector.h"

namespace moetron::nn {

class EncoderTrunk {
 public:
  EncoderTrunk(const EncoderTransformerConfig& cfg, const std::string& root, int64_t d_lm,
               Precision prec, ParameterSet& params);

  // x: [B * N, d_enc] embedded tokens, N per item; returns [B * N, d_lm].
  Tensor forward(kernels::Context& ctx, const Tensor& x, int64_t batch, int64_t tokens);
  // Returns the gradient wrt x; every parameter's gradient accumulates.
  Tensor backward(kernels::Context& ctx, const Tensor& d_out);
  void release();
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }

 private:
  int64_t d_;
  float eps_;
  Precision prec_;
  std::vector<std::unique_ptr<Block>> blocks_;
  Parameter* norm_;
  Projector projector_;
  Tensor x_final_, rstd_;
};

}  // namespace moetron::nn
