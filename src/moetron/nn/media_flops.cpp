#include "moetron/nn/media_flops.h"

#include <algorithm>

#include "moetron/nn/media_fusion.h"

namespace moetron::nn {

namespace {

double item_flops(const MultimodalModelConfig& cfg, const MediaGroup& g, int64_t d_lm,
                  int64_t* tokens) {
  const Tensor& in = g.input;
  if (g.modality == Modality::image) {
    const VisionConfig& v = cfg.vision;
    *tokens = image_tokens(v, in.dim(2), in.dim(3));
    const auto n = static_cast<double>(*tokens);
    const auto stem = static_cast<double>(v.transformer.d_model * v.channels * v.patch * v.patch);
    return 4.0 * stem * n + encoder_trunk_flops(v.transformer, *tokens, d_lm);
  }
  const AudioConfig& a = cfg.audio;
  const int64_t d = a.transformer.d_model, k = a.conv_kernel;
  const int64_t frames1 = kernels::conv1d_output_length(in.dim(1), k, {a.conv1_stride, k / 2});
  *tokens = audio_tokens(a, in.dim(1));
  const double conv1 = 4.0 * static_cast<double>(d * a.n_mels * k * frames1);
  const double conv2 = 6.0 * static_cast<double>(d * d * k * *tokens);
  return conv1 + conv2 + encoder_trunk_flops(a.transformer, *tokens, d_lm);
}

}  // namespace

double encoder_trunk_flops(const EncoderTransformerConfig& e, int64_t tokens, int64_t d_lm) {
  const auto d = static_cast<double>(e.d_model), f = static_cast<double>(e.ffn_hidden);
  const auto l = static_cast<double>(e.n_layers), n = static_cast<double>(tokens);
  const double gemm = l * (4 * d * d + 3 * d * f) + d * d_lm + static_cast<double>(d_lm * d_lm);
  return n * (6.0 * gemm + 12.0 * l * d * n);  // non-causal: every token sees all n
}

double media_flops(const MultimodalModelConfig& cfg, const ModelConfig& lm,
                   const MultimodalBatch& mm, int64_t seq) {
  if (!cfg.enabled) return 0;
  double total = 0, media_tokens = 0, attended = 0;
  for (const MediaGroup& g : mm.media) {
    int64_t tokens = 0;
    total += static_cast<double>(g.rows.size()) * item_flops(cfg, g, lm.d_model, &tokens);
    const double items = static_cast<double>(g.rows.size()) * static_cast<double>(tokens);
    media_tokens += items;
    attended += items * static_cast<double>(seq);  // (text token, media token) pairs
  }
  int64_t layers = 0;
  for (int64_t i = 0; i < lm.n_layers; ++i) layers += cfg.cross_attention_at(i) ? 1 : 0;
  if (layers == 0) return total;
  const auto d = static_cast<double>(lm.d_model), f = static_cast<double>(lm.ffn_hidden);
  const auto hd = static_cast<double>(lm.resolved_head_dim());
  const double q = static_cast<double>(lm.n_heads) * hd,
               kv = static_cast<double>(lm.n_kv_heads) * hd;
  const double text = static_cast<double>(mm.row_task.size()) * static_cast<double>(seq);
  // Per layer: q, o and the gated SwiGLU over every text token; k, v over the
  // media tokens; attention of each text token over its row's media.
  const double per_layer =
      6.0 * (text * (2 * d * q + 3 * d * f) + media_tokens * 2 * d * kv) + 12.0 * q * attended;
  return total + static_cast<double>(layers) * per_layer;
}

}  // namespace moetron::nn
