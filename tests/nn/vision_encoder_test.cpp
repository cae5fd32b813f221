// The ViT-style vision encoder: fp64 reference gradients of every parameter
// against finite differences, the CPU fp32 and bf16 encoders against the
// reference, patch layout, names and size checks.
#include "moetron/nn/vision_encoder.h"

#include <gtest/gtest.h>

#include <string>

#include "util/test_util.h"

namespace moetron::nn {
namespace {

VisionConfig tiny_vision() {
  VisionConfig v;
  v.transformer.d_model = 8;
  v.transformer.n_layers = 2;
  v.transformer.n_heads = 2;
  v.transformer.ffn_hidden = 12;
  v.transformer.init_std = 0.3;  // gradients well above finite-difference noise
  v.channels = 2;
  v.patch = 2;
  v.max_rows = 3;
  v.max_cols = 4;
  return v;
}
constexpr int64_t kLmWidth = 6;

// sum(out * r) in double: a random linear functional of the tokens.
double functional(const Tensor& out, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += test::element(out, i) * test::element(r, i);
  return s;
}

TEST(VisionEncoder, ReferenceGradientsMatchFiniteDifferences) {
  kernels::Context ref(kernels::Backend::reference);
  ParameterSet params;
  VisionEncoder enc(tiny_vision(), kLmWidth, Precision::fp64(), params);
  params.initialize(11);
  // Two 4 x 6 images: 2 x 3 patches each (row table partly unused).
  const Tensor images = test::random_tensor({2, 2, 4, 6}, DType::f32, "images");
  const Tensor r = test::random_tensor({12, kLmWidth}, DType::f64, "r");
  params.zero_grads();
  const Tensor tokens = enc.forward(ref, images);
  ASSERT_EQ(tokens.shape(), (Shape{12, kLmWidth}));
  enc.backward(ref, r);
  const auto loss = [&] {
    const double v = functional(enc.forward(ref, images), r);
    enc.release();
    return v;
  };
  for (const auto& p : params.all()) {
    SCOPED_TRACE(p->name);
    EXPECT_TRUE(test::finite_difference_check(loss, p->value, p->grad, 1e-6, 2e-5));
  }
}

TEST(VisionEncoder, ParameterNames) {
  ParameterSet params;
  VisionEncoder enc(tiny_vision(), kLmWidth, Precision::fp32(), params);
  for (const char* name :
       {"vision.patch_embed.weight", "vision.pos_embed_row.weight", "vision.pos_embed_col.weight",
        "vision.layers.0.input_layernorm.weight", "vision.layers.1.self_attn.q_proj.weight",
        "vision.layers.1.mlp.down_proj.weight", "vision.norm.weight", "vision.projector.0.weight",
        "vision.projector.2.weight"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  for (const auto& p : params.all()) EXPECT_EQ(p->name.rfind("vision.", 0), 0u) << p->name;
  ASSERT_EQ(enc.parameters().size(), params.all().size());
  for (size_t i = 0; i < params.all().size(); ++i)
    EXPECT_EQ(enc.parameters()[i], params.all()[i].get());
  EXPECT_EQ(params.get("vision.patch_embed.weight").value.shape(), (Shape{8, 8}));
  EXPECT_EQ(params.get("vision.projector.0.weight").value.shape(), (Shape{kLmWidth, 8}));
}

TEST(VisionEncoder, PatchesAreRowMajorWithChannelMajorColumns) {
  // Pixel (b, ch, y, x) = 1000 b + 100 ch + 10 y + x; patch 2 over 4 x 6.
  Tensor images = Tensor::empty({2, 2, 4, 6}, DType::f32);
  for (int64_t i = 0; i < images.numel(); ++i) {
    const int64_t x = i % 6, y = (i / 6) % 4, ch = (i / 24) % 2, b = i / 48;
    images.data<float>()[i] = static_cast<float>(1000 * b + 100 * ch + 10 * y + x);
  }
  const Tensor p = image_patches(images, 2);
  ASSERT_EQ(p.shape(), (Shape{12, 8}));
  // Row 1 * 6 + 1 * 3 + 2: image 1, patch row 1, patch column 2 (pixels y 2..3, x 4..5).
  const float* row = p.data<float>() + (6 + 3 + 2) * 8;
  const float want[8] = {1024, 1025, 1034, 1035, 1124, 1125, 1134, 1135};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(row[j], want[j]) << j;
}

TEST(VisionEncoder, ImageSizesAreChecked) {
  VisionConfig v = tiny_vision();
  ParameterSet ps;
  VisionEncoder enc(v, kLmWidth, Precision::fp32(), ps);
  EXPECT_EQ(enc.tokens_per_image(6, 8), 12);
  EXPECT_NE(test::error_of([&] { enc.tokens_per_image(5, 8); }).find("does not split"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { enc.tokens_per_image(8, 8); }).find("position tables hold 3 x 4"),
            std::string::npos);
  // Square scenes and wide text lines share one max_rows x max_cols table.
  v.max_rows = 16;
  v.max_cols = 16;
  v.patch = 4;
  ParameterSet ps2;
  VisionEncoder shared(v, kLmWidth, Precision::fp32(), ps2);
  EXPECT_EQ(shared.tokens_per_image(32, 32), 64);
  EXPECT_EQ(shared.tokens_per_image(16, 64), 64);
}

// The parameter gradients of an encoder built with `prec` after forward and
// backward on `images` with output gradient r (in the compute dtype).
ParameterSet gradients(Precision prec, kernels::Context& ctx, const Tensor& images,
                       const Tensor& r) {
  ParameterSet params;
  VisionConfig v = tiny_vision();
  v.transformer.d_model = 16;
  v.transformer.init_std = 0.1;
  VisionEncoder enc(v, kLmWidth, prec, params);
  params.initialize(12);
  params.zero_grads();
  enc.forward(ctx, images);
  enc.backward(ctx, test::to_dtype(r, prec.compute));
  return params;
}

TEST(VisionEncoder, CpuMatchesReference) {
  kernels::Context ref(kernels::Backend::reference), cpu(kernels::Backend::cpu);
  const Tensor images = test::random_tensor({3, 2, 6, 8}, DType::f32, "images");
  const Tensor r = test::random_tensor({36, kLmWidth}, DType::f64, "r");
  const ParameterSet want = gradients(Precision::fp64(), ref, images, r);
  for (const Precision prec : {Precision::fp32(), Precision::bf16(), Precision::fp16()}) {
    const double tol = prec.compute == DType::f32 ? 1e-4 : 5e-2;
    const ParameterSet got = gradients(prec, cpu, images, r);
    for (size_t i = 0; i < want.all().size(); ++i) {
      EXPECT_TRUE(test::normalized_close(got.all()[i]->grad, want.all()[i]->grad, tol))
          << want.all()[i]->name << " " << dtype_name(prec.compute);
    }
  }
}

}  // namespace
}  // namespace moetron::nn
