// Model FLOPs per token, the MFU numerator (REFERENCE.md): 6 x active
// parameters touched by GEMMs (forward 2, backward 4) plus causal attention
// 12 L (H hd) S per token, counted both ways as in PaLM's definition. A
// local (sliding-window) layer counts its visible pairs the same way:
// 12 (H hd) x 2 pairs / S, about 24 (H hd)(window + global tokens) per token
// once S is well past the window, so MFU stays comparable across patterns. The
// embedding is a gather and does not count (unless tied, where it is the head).
#pragma once

#include <cstdint>

#include "moetron/nn/model_config.h"

namespace moetron::nn {

// Parameters a token's GEMMs touch: attention, the K routed experts (and the
// shared ones) of each MoE layer, the router, dense FFNs, and the LM head.
double active_gemm_params(const ModelConfig& m, const MoeConfig& e);
double model_flops_per_token(const ModelConfig& m, const MoeConfig& e, int64_t seq_len);
// Training FLOPs per token of decoder layer i (its GEMMs and attention), and
// of the LM head: the pipeline's per-stage cost estimate.
double layer_flops_per_token(const ModelConfig& m, const MoeConfig& e, int64_t i, int64_t seq_len);
double head_flops_per_token(const ModelConfig& m);

}  // namespace moetron::nn
