// nn/media_flops.h against the modules as built: the GEMM weights an
// encoder's tokens go through are counted from its registered parameters.
#include "moetron/nn/media_flops.h"

#include <gtest/gtest.h>

#include "moetron/nn/media_fusion.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

MultimodalModelConfig media() {
  MultimodalModelConfig c;
  c.enabled = true;
  c.vision.transformer = {12, 2, 2, 20, 1e-5, 0.02};
  c.audio.transformer = {8, 1, 2, 10, 1e-5, 0.02};
  c.vision.patch = 2;
  c.audio.n_mels = 4;
  return c;
}

// Elements of the built parameters whose names start with `prefix` and
// contain `part`.
double numel_of(const ParameterSet& ps, const std::string& prefix, const std::string& part) {
  double n = 0;
  for (const auto& p : ps.all())
    if (p->name.rfind(prefix, 0) == 0 && p->name.find(part) != std::string::npos)
      n += static_cast<double>(p->value.numel());
  return n;
}

TEST(MediaFlops, EncodersCountTheirBuiltWeights) {
  const MultimodalModelConfig cfg = media();
  ParameterSet ps;
  MediaFusion fusion(cfg, 16, Precision::fp32(), ps, nullptr);
  MultimodalBatch mm;
  mm.row_task = {0, 0, 0};
  mm.media.push_back({Modality::image, test::random_tensor({2, 3, 4, 6}, DType::f32, "i"), {0, 1}});
  ModelConfig lm;
  lm.d_model = 16;
  const int64_t n = 6;  // 2 x 3 patches
  // Hidden matrices of the blocks and the projector: 6 per token; the patch
  // embedding 4 (the image needs no gradient); attention 12 d n per token.
  const double gemm =
      numel_of(ps, "vision.layers.", "_proj.weight") + numel_of(ps, "vision.projector.", ".weight");
  const double want =
      2.0 * n * (6.0 * gemm + 4.0 * numel_of(ps, "vision.patch_embed", "") + 12.0 * 2 * 12 * n);
  EXPECT_NEAR(media_flops(cfg, lm, mm, 8), want, 1e-9 * want);
  MultimodalModelConfig off = cfg;
  off.enabled = false;
  EXPECT_EQ(media_flops(off, lm, mm, 8), 0.0);
}

TEST(MediaFlops, CrossAttentionLayersAddPerLayer) {
  MultimodalModelConfig cfg = media();
  ModelConfig lm;
  lm.d_model = 16;
  lm.n_layers = 4;
  lm.n_heads = 2;
  lm.n_kv_heads = 1;
  lm.ffn_hidden = 24;
  MultimodalBatch mm;
  mm.row_task = {0, 0};
  mm.media.push_back({Modality::audio, test::random_tensor({1, 9, 4}, DType::f32, "a"), {1}});
  const double prefix = media_flops(cfg, lm, mm, 10);
  cfg.fusion = "both";
  cfg.cross_attention_every = 1;
  const double every = media_flops(cfg, lm, mm, 10) - prefix;
  cfg.cross_attention_every = 2;
  const double half = media_flops(cfg, lm, mm, 10) - prefix;
  EXPECT_GT(half, 0);
  EXPECT_NEAR(every, 2 * half, 1e-9 * every);  // 4 layers vs 2
}

}  // namespace
}  // namespace moetron::nn
