// ViT-style image encoder (issue 21): images [B, C, H, W] (normalised by the
// caller) -> p x p patches as rows [B * N, C p p] (N = (H / p)(W / p), patch
// (r, c) at row r * (W / p) + c; column ch * p * p + i * p + j, a Conv2d
// weight's flattening) -> patch embedding (one GEMM, no bias) -> + row and
// column position embeddings of the patch -> non-causal blocks -> RMSNorm ->
// projector into the language model's width.
//
// Parameters (ParameterSet passed in; Hugging Face-style names):
//   vision.patch_embed.weight        [d, C p p]
//   vision.pos_embed_row.weight      [max_rows, d]
//   vision.pos_embed_col.weight      [max_cols, d]
//   vision.layers.{i}.input_layernorm.weight, .self_attn.{q,k,v,o}_proj.weight,
//   vision.layers.{i}.post_attention_layernorm.weight, .mlp.{gate,up,down}_proj.weight
//   vision.norm.weight               [d]
//   vision.projector.0.weight        [d_lm, d]
//   vision.projector.2.weight        [d_lm, d_lm]
// The images get no gradient. Tensors live on the host (CPU and reference
// backends): patchify and the position ids are host loops.
#pragma once

#include <string>
#include <vector>

#include "moetron/nn/encoder_trunk.h"

namespace moetron::nn {

// The p x p patches of images f32 or f64 [B, C, H, W] (H, W multiples of
// p) as rows [B * N, C p p] of the same dtype, in the order described above.
Tensor image_patches(const Tensor& images, int64_t patch);

class VisionEncoder {
 public:
  VisionEncoder(const VisionConfig& cfg, int64_t d_lm, Precision prec, ParameterSet& params,
                const std::string& root = "vision.");

  // images: f32 (or f64) [B, C, H, W], H and W multiples of the patch, at
  // most max_rows x max_cols patches. Returns tokens [B * N, d_lm].
  Tensor forward(kernels::Context& ctx, const Tensor& images);
  // d_tokens: [B * N, d_lm]; every parameter's gradient accumulates.
  void backward(kernels::Context& ctx, const Tensor& d_tokens);
  void release();
  // Tokens per image of H x W pixels (checks the size).
  int64_t tokens_per_image(int64_t height, int64_t width) const;
  const VisionConfig& config() const { return cfg_; }
  // This encoder's parameters in registration order (for the trainer's hooks:
  // gradient-ready and before-use callbacks).
  const std::vector<Parameter*>& parameters() const { return own_; }

 private:
  VisionConfig cfg_;
  Precision prec_;
  size_t first_param_;
  std::vector<Parameter*> own_;
  Parameter *patch_embed_, *pos_row_, *pos_col_;
  EncoderTrunk trunk_;
  Tensor patches_, row_ids_, col_ids_;
};

}  // namespace moetron::nn
