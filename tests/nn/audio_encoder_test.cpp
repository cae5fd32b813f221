// The Whisper-style audio encoder: fp64 reference gradients of every
// parameter (convolutions included) against finite differences, the CPU
// fp32 and bf16 encoders against the reference, token counts of the strided
// convolutions and names.
#include "moetron/nn/audio_encoder.h"

#include <gtest/gtest.h>

#include "util/test_util.h"

namespace moetron::nn {
namespace {

AudioConfig tiny_audio(int64_t stride1 = 1, int64_t stride2 = 2) {
  AudioConfig a;
  a.transformer.d_model = 8;
  a.transformer.n_layers = 2;
  a.transformer.n_heads = 2;
  a.transformer.ffn_hidden = 12;
  a.transformer.init_std = 0.3;
  a.n_mels = 5;
  a.conv_kernel = 3;
  a.conv1_stride = stride1;
  a.conv2_stride = stride2;
  return a;
}
constexpr int64_t kLmWidth = 6;

double functional(const Tensor& out, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += test::element(out, i) * test::element(r, i);
  return s;
}

TEST(AudioEncoder, TokenCountsFollowTheStrides) {
  ParameterSet p1, p2;
  AudioEncoder whisper(tiny_audio(1, 2), kLmWidth, Precision::fp32(), p1);
  AudioEncoder quarter(tiny_audio(2, 2), kLmWidth, Precision::fp32(), p2, "audio4.");
  EXPECT_EQ(whisper.tokens_for_frames(3000), 1500);
  EXPECT_EQ(whisper.tokens_for_frames(7), 4);
  EXPECT_EQ(quarter.tokens_for_frames(100), 25);
  EXPECT_EQ(quarter.tokens_for_frames(9), 3);
}

TEST(AudioEncoder, ReferenceGradientsMatchFiniteDifferences) {
  for (const int64_t stride1 : {1, 2}) {
    kernels::Context ref(kernels::Backend::reference);
    ParameterSet params;
    AudioEncoder enc(tiny_audio(stride1, 2), kLmWidth, Precision::fp64(), params);
    params.initialize(21);
    // Biases start at zero: give them values so their effect is not special.
    for (const char* b : {"audio.conv1.bias", "audio.conv2.bias"})
      params.get(b).value.copy_from(test::random_tensor({8}, DType::f64, b));
    const Tensor mel = test::random_tensor({2, 9, 5}, DType::f32, "mel");
    const int64_t n = enc.tokens_for_frames(9);
    const Tensor r = test::random_tensor({2 * n, kLmWidth}, DType::f64, "r");
    params.zero_grads();
    ASSERT_EQ(enc.forward(ref, mel).shape(), (Shape{2 * n, kLmWidth}));
    enc.backward(ref, r);
    const auto loss = [&] {
      const double v = functional(enc.forward(ref, mel), r);
      enc.release();
      return v;
    };
    for (const auto& p : params.all()) {
      SCOPED_TRACE(p->name + " stride1 " + std::to_string(stride1));
      EXPECT_TRUE(test::finite_difference_check(loss, p->value, p->grad, 1e-6, 2e-5));
    }
  }
}

TEST(AudioEncoder, ParameterNames) {
  ParameterSet params;
  AudioEncoder enc(tiny_audio(), kLmWidth, Precision::fp32(), params);
  for (const char* name :
       {"audio.conv1.weight", "audio.conv1.bias", "audio.conv2.weight", "audio.conv2.bias",
        "audio.layers.0.self_attn.k_proj.weight", "audio.layers.1.mlp.up_proj.weight",
        "audio.norm.weight", "audio.projector.0.weight", "audio.projector.2.weight"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  EXPECT_EQ(params.get("audio.conv1.weight").value.shape(), (Shape{8, 5, 3}));
  ASSERT_EQ(enc.parameters().size(), params.all().size());
  for (const Parameter* p : enc.parameters()) EXPECT_EQ(p->name.rfind("audio.", 0), 0u) << p->name;
  EXPECT_EQ(params.get("audio.conv2.weight").value.shape(), (Shape{8, 8, 3}));
}

ParameterSet gradients(Precision prec, kernels::Context& ctx, const Tensor& mel, const Tensor& r) {
  ParameterSet params;
  AudioConfig a = tiny_audio();
  a.transformer.d_model = 16;
  a.transformer.init_std = 0.1;
  AudioEncoder enc(a, kLmWidth, prec, params);
  params.initialize(22);
  params.zero_grads();
  enc.forward(ctx, mel);
  enc.backward(ctx, test::to_dtype(r, prec.compute));
  return params;
}

TEST(AudioEncoder, CpuMatchesReference) {
  kernels::Context ref(kernels::Backend::reference), cpu(kernels::Backend::cpu);
  const Tensor mel = test::random_tensor({3, 33, 5}, DType::f32, "mel");
  const Tensor r = test::random_tensor({3 * 17, kLmWidth}, DType::f64, "r");
  const ParameterSet want = gradients(Precision::fp64(), ref, mel, r);
  for (const Precision prec : {Precision::fp32(), Precision::bf16(), Precision::fp16()}) {
    const double tol = prec.compute == DType::f32 ? 1e-4 : 5e-2;
    const ParameterSet got = gradients(prec, cpu, mel, r);
    for (size_t i = 0; i < want.all().size(); ++i) {
      EXPECT_TRUE(test::normalized_close(got.all()[i]->grad, want.all()[i]->grad, tol))
          << want.all()[i]->name << " " << dtype_name(prec.compute);
    }
  }
}

}  // namespace
}  // namespace moetron::nn
