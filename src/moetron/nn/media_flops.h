// Model FLOPs of a multimodal micro-batch beyond the language model's
// per-token count (nn/flops.h), for MFU: each media item's encoder (its stem,
// non-causal blocks and projector) and, with cross-attention fusion, the
// gated layers. Counted as model_flops_per_token counts: 6 per GEMM weight
// per token where the input needs a gradient, 4 where it does not (the
// patch embedding and the first convolution read the media themselves),
// and 12 d x keys per token for attention; the encoders' recompute in
// backward (nn/media_fusion.h) is not counted.
#pragma once

#include <cstdint>

#include "moetron/nn/model_config.h"
#include "moetron/nn/multimodal_batch.h"
#include "moetron/nn/multimodal_config.h"

namespace moetron::nn {

// Training FLOPs of one encoder item of `tokens` tokens out of its
// transformer and projector (into width d_lm).
double encoder_trunk_flops(const EncoderTransformerConfig& e, int64_t tokens, int64_t d_lm);
// The batch's media (rows of `seq` positions) through `cfg`'s encoders and
// cross-attention layers of the language model `lm`.
double media_flops(const MultimodalModelConfig& cfg, const ModelConfig& lm,
                   const MultimodalBatch& mm, int64_t seq);

}  // namespace moetron::nn
