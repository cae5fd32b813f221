// The MFU numerator's attention term follows the mask each layer uses.
#include "moetron/nn/flops.h"

#include <gtest/gtest.h>

#include "moetron/kernels/attention.h"

namespace moetron::nn {
namespace {

TEST(Flops, AttendedPairsCountTheVisibleKeysOfEachLayer) {
  for (const int64_t window : {1, 3, 16}) {
    for (const int64_t global : {0, 2, 5}) {
      ModelConfig m;
      m.attention_window = window;
      m.attention_global_tokens = global;
      m.attention_layer_pattern = "LG";
      kernels::AttentionMask mask;
      mask.window = window;
      mask.num_global = global;
      for (const int64_t seq : {1, 4, 23}) {
        double visible = 0;
        for (int64_t i = 0; i < seq; ++i)
          for (int64_t j = 0; j < seq; ++j) visible += kernels::attention_visible(mask, i, j);
        SCOPED_TRACE(testing::Message() << "w" << window << " g" << global << " S" << seq);
        EXPECT_EQ(layer_attended_pairs(m, 0, seq), visible);
        const auto s = static_cast<double>(seq);
        EXPECT_EQ(layer_attended_pairs(m, 1, seq), s * (s + 1) / 2);  // the global layer
      }
    }
  }
}

TEST(Flops, ALocalLayerCostsItsWindowNotTheSequence) {
  ModelConfig full;
  full.n_layers = 6;
  ModelConfig hybrid = full;
  hybrid.attention_window = 1024;
  hybrid.attention_global_tokens = 16;
  hybrid.attention_layer_pattern = "LLLLLG";
  const MoeConfig e;
  const int64_t s = 131072;
  const double per_key = 12.0 * static_cast<double>(full.n_heads * full.resolved_head_dim());
  // Full: S keys per token in every layer (PaLM's count); a local layer
  // about 2 (window + global) once S is far past the window.
  EXPECT_DOUBLE_EQ(layer_flops_per_token(full, e, 0, s) - layer_flops_per_token(full, e, 0, 1),
                   per_key * (s - 1));
  const double gemm = layer_flops_per_token(full, e, 0, s) - per_key * s;
  const double local_keys = (layer_flops_per_token(hybrid, e, 0, s) - gemm) / per_key;
  EXPECT_NEAR(local_keys, 2.0 * (1024 + 16), 2.0 * 1040 * 0.01);
  EXPECT_DOUBLE_EQ(layer_flops_per_token(hybrid, e, 5, s), layer_flops_per_token(full, e, 5, s));
  EXPECT_LT(model_flops_per_token(hybrid, e, s), model_flops_per_token(full, e, s) / 4);
}

}  // namespace
}  // namespace moetron::nn
