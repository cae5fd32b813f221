// Gated cross-attention (Flamingo): finite differences of every parameter,
// the gates included, and of the text and media inputs (fp64 reference);
// closed gates return x exactly with non-zero gate gradients; rows without
// media are unchanged and send no gradient to their media; rows of different
// media lengths ignore their unused slots; no media at all; CPU (f32, bf16)
// against the reference; micro-batches in flight.
#include "moetron/nn/cross_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "util/test_util.h"

namespace moetron::nn {
namespace {

ModelConfig tiny_lm() {
  ModelConfig m;
  m.d_model = 8;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 10;
  m.init_std = 0.3;
  return m;
}

constexpr int64_t kBatch = 3, kSeq = 4, kMedia = 5;
const char* kPrefix = "model.layers.1.cross_attn.";

double functional(const Tensor& out, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += test::element(out, i) * test::element(r, i);
  return s;
}

void set_gate(Parameter& g, double v) {
  g.value.fill(v);
}

TEST(GatedCrossAttention, ReferenceGradientsMatchFiniteDifferences) {
  const std::vector<std::vector<int64_t>> cases = {{}, {kMedia, 0, kMedia}, {2, 0, kMedia}};
  for (const std::vector<int64_t>& media_len : cases) {
    const bool all_media = media_len.empty();
    SCOPED_TRACE(all_media ? "every row has media" : "row 1 without media");
    kernels::Context ref(kernels::Backend::reference);
    ParameterSet params;
    GatedCrossAttention xattn(tiny_lm(), kPrefix, Precision::fp64(), params);
    params.initialize(31);
    set_gate(xattn.attn_gate(), 0.7);
    set_gate(xattn.mlp_gate(), -0.4);
    const Tensor x = test::random_tensor({kBatch * kSeq, 8}, DType::f64, "x");
    const Tensor media = test::random_tensor({kBatch * kMedia, 8}, DType::f64, "media");
    const Tensor r = test::random_tensor({kBatch * kSeq, 8}, DType::f64, "r");
    params.zero_grads();
    xattn.forward(ref, x, media, kBatch, kSeq, media_len);
    Tensor d_media = Tensor::zeros(media.shape(), DType::f64);
    const Tensor dx = xattn.backward(ref, r, d_media);
    const auto loss = [&] {
      const double v = functional(xattn.forward(ref, x, media, kBatch, kSeq, media_len), r);
      xattn.release();
      return v;
    };
    for (const auto& p : params.all()) {
      SCOPED_TRACE(p->name);
      EXPECT_TRUE(test::finite_difference_check(loss, p->value, p->grad, 1e-6, 2e-5));
    }
    EXPECT_TRUE(test::finite_difference_check(loss, x, dx, 1e-6, 2e-5)) << "x";
    EXPECT_TRUE(test::finite_difference_check(loss, media, d_media, 1e-6, 2e-5)) << "media";
    if (!all_media) {
      for (int64_t i = kMedia * 8; i < 2 * kMedia * 8; ++i)
        ASSERT_EQ(d_media.data<double>()[i], 0.0) << "media of row 1, element " << i;
      for (int64_t i = media_len[0] * 8; i < kMedia * 8; ++i)
        ASSERT_EQ(d_media.data<double>()[i], 0.0) << "unused slot of row 0, element " << i;
    }
  }
}

TEST(GatedCrossAttention, ClosedGatesReturnXExactlyWithNonZeroGateGradients) {
  kernels::Context cpu(kernels::Backend::cpu), ref(kernels::Backend::reference);
  for (const Precision prec :
       {Precision::fp32(), Precision::bf16(), Precision::fp16(), Precision::fp64()}) {
    SCOPED_TRACE(dtype_name(prec.compute));
    kernels::Context& ctx = prec.compute == DType::f64 ? ref : cpu;
    ParameterSet params;
    GatedCrossAttention xattn(tiny_lm(), kPrefix, prec, params);
    params.initialize(32);  // the gates initialise to 0
    EXPECT_EQ(test::element(xattn.attn_gate().value, 0), 0.0);
    EXPECT_EQ(test::element(xattn.mlp_gate().value, 0), 0.0);
    const Tensor x = test::random_tensor({kBatch * kSeq, 8}, prec.compute, "x");
    const Tensor media = test::random_tensor({kBatch * kMedia, 8}, prec.compute, "media");
    params.zero_grads();
    const Tensor out = xattn.forward(ctx, x, media, kBatch, kSeq);
    EXPECT_TRUE(test::all_close(out, x, {0, 0}));
    const Tensor r = test::random_tensor({kBatch * kSeq, 8}, prec.compute, "r");
    const Tensor dx = xattn.backward(ctx, r, Tensor());
    EXPECT_TRUE(test::all_close(dx, r, {0, 0}));  // the identity's gradient
    EXPECT_GT(std::abs(test::element(xattn.attn_gate().grad, 0)), 1e-3);
    EXPECT_GT(std::abs(test::element(xattn.mlp_gate().grad, 0)), 1e-3);
  }
}

TEST(GatedCrossAttention, RowsWithoutMediaAttendToNothing) {
  // Attention gate open, MLP gate closed: a row without media is unchanged,
  // whatever its (ignored) media rows hold; a row with media changes.
  kernels::Context cpu(kernels::Backend::cpu);
  ParameterSet params;
  GatedCrossAttention xattn(tiny_lm(), kPrefix, Precision::fp32(), params);
  params.initialize(33);
  set_gate(xattn.attn_gate(), 1.0);
  const Tensor x = test::random_tensor({kBatch * kSeq, 8}, DType::f32, "x");
  const Tensor media = test::random_tensor({kBatch * kMedia, 8}, DType::f32, "media");
  const Tensor out = xattn.forward(cpu, x, media, kBatch, kSeq, {kMedia, 0, kMedia});
  xattn.release();
  EXPECT_TRUE(test::all_close(out.slice(kSeq, 2 * kSeq), x.slice(kSeq, 2 * kSeq), {0, 0}));
  EXPECT_FALSE(test::all_close(out.slice(0, kSeq), x.slice(0, kSeq), {1e-3, 1e-3}));
  EXPECT_NE(test::error_of([&] {
              xattn.forward(cpu, x, media, kBatch, kSeq, {kMedia, 0});
            }).find("2 media lengths for 3 rows"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              xattn.forward(cpu, x, media, kBatch, kSeq, {kMedia, 0, kMedia + 1});
            }).find("a row of 6 media tokens in 5 slots"),
            std::string::npos);
}

TEST(GatedCrossAttention, ARowReadsOnlyItsFirstMediaLenSlots) {
  // Row 0 has 2 of its 5 slots: its output is that of a batch whose media
  // are those 2 tokens alone, whatever the unused slots hold.
  kernels::Context cpu(kernels::Backend::cpu);
  ParameterSet params;
  GatedCrossAttention xattn(tiny_lm(), kPrefix, Precision::fp32(), params);
  params.initialize(36);
  set_gate(xattn.attn_gate(), 0.9);
  set_gate(xattn.mlp_gate(), 0.4);
  const Tensor x = test::random_tensor({kBatch * kSeq, 8}, DType::f32, "x");
  const Tensor media = test::random_tensor({kBatch * kMedia, 8}, DType::f32, "media");
  const Tensor out = xattn.forward(cpu, x, media, kBatch, kSeq, {2, 3, 0}).clone();
  xattn.release();
  const Tensor alone = xattn.forward(cpu, x.slice(0, kSeq), media.slice(0, 2), 1, kSeq).clone();
  xattn.release();
  EXPECT_TRUE(test::all_close(out.slice(0, kSeq), alone, {1e-6, 1e-6}));
  media.slice(2, kMedia).fill(7.0);  // row 0's unused slots
  media.slice(kMedia + 3, 2 * kMedia).fill(-3.0);
  const Tensor again = xattn.forward(cpu, x, media, kBatch, kSeq, {2, 3, 0});
  xattn.release();
  EXPECT_TRUE(test::all_close(again, out, {0, 0}));
}

TEST(GatedCrossAttention, NoMediaAtAllRunsTheGatedMlpOnly) {
  // media undefined (M = 0): the attention branch adds nothing; with the
  // attention gate open the result is that of every row without media.
  kernels::Context ref(kernels::Backend::reference);
  ParameterSet params;
  GatedCrossAttention xattn(tiny_lm(), kPrefix, Precision::fp64(), params);
  params.initialize(37);
  set_gate(xattn.attn_gate(), 0.8);
  set_gate(xattn.mlp_gate(), 0.5);
  const Tensor x = test::random_tensor({kBatch * kSeq, 8}, DType::f64, "x");
  const Tensor media = test::random_tensor({kBatch * kMedia, 8}, DType::f64, "media");
  const Tensor r = test::random_tensor({kBatch * kSeq, 8}, DType::f64, "r");
  const Tensor want = xattn.forward(ref, x, media, kBatch, kSeq, {0, 0, 0}).clone();
  const Tensor dx_want = xattn.backward(ref, r, Tensor()).clone();
  params.zero_grads();
  const Tensor got = xattn.forward(ref, x, Tensor(), kBatch, kSeq);
  EXPECT_TRUE(test::all_close(got, want, {1e-12, 1e-12}));
  const Tensor dx = xattn.backward(ref, r, Tensor());
  EXPECT_TRUE(test::all_close(dx, dx_want, {1e-12, 1e-12}));
  const auto loss = [&] {
    const double v = functional(xattn.forward(ref, x, Tensor(), kBatch, kSeq), r);
    xattn.release();
    return v;
  };
  for (const auto& p : params.all()) {
    SCOPED_TRACE(p->name);
    EXPECT_TRUE(test::finite_difference_check(loss, p->value, p->grad, 1e-6, 2e-5));
  }
}

ParameterSet gradients(Precision prec, kernels::Context& ctx, const Tensor& x, const Tensor& media,
                       const Tensor& r, Tensor& dx, Tensor& d_media) {
  ParameterSet params;
  ModelConfig m = tiny_lm();
  m.d_model = 16;
  m.init_std = 0.1;
  GatedCrossAttention xattn(m, kPrefix, prec, params);
  params.initialize(34);
  set_gate(xattn.attn_gate(), 0.5);
  set_gate(xattn.mlp_gate(), 0.8);
  params.zero_grads();
  xattn.forward(ctx, test::to_dtype(x, prec.compute), test::to_dtype(media, prec.compute), kBatch,
                kSeq, {kMedia, 2, 0});
  d_media = Tensor::zeros(media.shape(), prec.compute);
  dx = xattn.backward(ctx, test::to_dtype(r, prec.compute), d_media);
  return params;
}

TEST(GatedCrossAttention, CpuMatchesReference) {
  kernels::Context ref(kernels::Backend::reference), cpu(kernels::Backend::cpu);
  const Tensor x = test::random_tensor({kBatch * kSeq, 16}, DType::f64, "x");
  const Tensor media = test::random_tensor({kBatch * kMedia, 16}, DType::f64, "media");
  const Tensor r = test::random_tensor({kBatch * kSeq, 16}, DType::f64, "r");
  Tensor dx_want, dm_want;
  const ParameterSet want = gradients(Precision::fp64(), ref, x, media, r, dx_want, dm_want);
  for (const Precision prec : {Precision::fp32(), Precision::bf16()}) {
    const double tol = prec.compute == DType::f32 ? 1e-4 : 5e-2;
    Tensor dx, dm;
    const ParameterSet got = gradients(prec, cpu, x, media, r, dx, dm);
    for (size_t i = 0; i < want.all().size(); ++i) {
      EXPECT_TRUE(test::normalized_close(got.all()[i]->grad, want.all()[i]->grad, tol))
          << want.all()[i]->name << " " << dtype_name(prec.compute);
    }
    EXPECT_TRUE(test::normalized_close(dx, dx_want, tol));
    EXPECT_TRUE(test::normalized_close(dm, dm_want, tol));
  }
}

TEST(GatedCrossAttention, MicroBatchesInFlightGiveTheSequentialGradients) {
  kernels::Context cpu(kernels::Backend::cpu);
  ParameterSet p1, p2;
  GatedCrossAttention a1(tiny_lm(), kPrefix, Precision::fp32(), p1);
  GatedCrossAttention a2(tiny_lm(), kPrefix, Precision::fp32(), p2);
  for (ParameterSet* p : {&p1, &p2}) {
    p->initialize(35);
    set_gate(p->get(std::string(kPrefix) + "attn_gate"), 0.3);
    set_gate(p->get(std::string(kPrefix) + "mlp_gate"), 0.6);
  }
  const Tensor xa = test::random_tensor({kBatch * kSeq, 8}, DType::f32, "xa");
  const Tensor ma = test::random_tensor({kBatch * kMedia, 8}, DType::f32, "ma");
  const Tensor xb = test::random_tensor({kSeq, 8}, DType::f32, "xb");
  const Tensor mb = test::random_tensor({2, 8}, DType::f32, "mb");
  const Tensor ra = test::random_tensor({kBatch * kSeq, 8}, DType::f32, "ra");
  const Tensor rb = test::random_tensor({kSeq, 8}, DType::f32, "rb");
  a1.forward(cpu, xa, ma, kBatch, kSeq);
  const Tensor dxa1 = a1.backward(cpu, ra, Tensor());
  a1.forward(cpu, xb, mb, 1, kSeq);
  a1.backward(cpu, rb, Tensor());
  GatedCrossAttention::Saved parked;
  a2.forward(cpu, xa, ma, kBatch, kSeq);
  a2.swap_saved(parked);
  a2.forward(cpu, xb, mb, 1, kSeq);
  a2.backward(cpu, rb, Tensor());
  a2.swap_saved(parked);
  const Tensor dxa2 = a2.backward(cpu, ra, Tensor());
  EXPECT_TRUE(test::all_close(dxa2, dxa1, {0, 0}));
  for (size_t i = 0; i < p1.all().size(); ++i) {
    EXPECT_TRUE(test::all_close(p2.all()[i]->grad, p1.all()[i]->grad, {1e-5, 1e-6}))
        << p1.all()[i]->name;
  }
}

}  // namespace
}  // namespace moetron::nn
