// SwiGLU and softmax: CPU (and SwiGLU on CUDA) against the fp64 reference,
// finite differences of the reference backward, aliasing, bad inputs.
#include "moetron/kernels/activation.h"

#include <gtest/gtest.h>

#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// fp32: exp512 is ~1 ulp, the divide and the products add a few more, and
// d silu/dg = s + silu * (1 - s) can cancel near g = -1.28, hence the
// absolute floor on O(1) values.
constexpr test::Tolerance kF32{1e-5, 1e-6};
// Softmax probabilities are ~1/C: the row sum adds C roundings in fp32, so
// relative 2e-5; the floor is far below 1/C for the widths tested.
constexpr test::Tolerance kSoftmaxF32{2e-5, 1e-8};
// bf16 outputs: both backends round once to 8 significant bits, so a value
// near a rounding tie may land one bf16 ulp apart (2^-7 relative), plus an
// absolute floor for results that cancel to near zero.
constexpr test::Tolerance kBf16{8e-3, 1e-3};
constexpr test::Tolerance kSoftmaxBf16{8e-3, 1e-5};

double weighted_sum(const Tensor& out, const Tensor& weights) {
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += test::element(out, i) * test::element(weights, i);
  return s;
}

// Forward and backward of ctx's backend against the reference on every
// T x F of the given sizes (inputs copied to ctx's device, outputs back).
void swiglu_matches_reference(Context& ctx, const std::vector<int64_t>& sizes) {
  Context ref(Backend::reference);
  const auto dev = [&](const Tensor& t) { return test::on_device(ctx, t); };
  for (DType dt : {DType::f32, DType::bf16}) {
    const auto tol = dt == DType::f32 ? kF32 : kBf16;
    for (int64_t T : sizes) {
      for (int64_t F : sizes) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T=" << T << " F=" << F);
        // [-12, 12] reaches both saturated ends of the sigmoid.
        Tensor gu = random_tensor({T, 2 * F}, dt, "gate_up", -12.0f, 12.0f);
        Tensor out = dev(poisoned({T, F}, dt)), out_ref = poisoned({T, F}, dt);
        // Outputs scale with |g| <= 12, so the absolute floor does too.
        swiglu_forward(ctx, dev(gu), out);
        swiglu_forward(ref, gu, out_ref);
        EXPECT_TRUE(test::all_close(test::on_host(out), out_ref, {tol.rtol, tol.atol * 12}));

        Tensor dout = random_tensor({T, F}, dt, "dout");
        Tensor dgu = dev(poisoned({T, 2 * F}, dt)), dgu_ref = poisoned({T, 2 * F}, dt);
        swiglu_backward(ctx, dev(dout), dev(gu), dgu);
        swiglu_backward(ref, dout, gu, dgu_ref);
        EXPECT_TRUE(test::all_close(test::on_host(dgu), dgu_ref, {tol.rtol, tol.atol * 12}));
      }
    }
  }
}

TEST(SwiGlu, CpuMatchesReferenceForwardAndBackward) {
  Context cpu(Backend::cpu);
  swiglu_matches_reference(cpu, test::kAwkwardSizes);
}

// Also F past one block of threads (300) with a ragged tail.
TEST(SwiGlu, CudaMatchesReferenceForwardAndBackward) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  std::vector<int64_t> sizes = test::kAwkwardSizes;
  sizes.push_back(300);
  swiglu_matches_reference(gpu, sizes);
}

// Gates far past where exp overflows: silu saturates to 0 or g, no NaN.
void swiglu_extreme_gates(Context& ctx) {
  Context ref(Backend::reference);
  Tensor gu = Tensor::empty({1, 8}, DType::f32);
  float* p = gu.data<float>();
  const float gates[4] = {-200.0f, -90.0f, 90.0f, 200.0f};
  for (int j = 0; j < 4; ++j) {
    p[j] = gates[j];
    p[4 + j] = 0.5f;
  }
  Tensor out = test::on_device(ctx, poisoned({1, 4}, DType::f32));
  Tensor out_ref = poisoned({1, 4}, DType::f32);
  swiglu_forward(ctx, test::on_device(ctx, gu), out);
  swiglu_forward(ref, gu, out_ref);
  EXPECT_TRUE(test::all_close(test::on_host(out), out_ref, kF32));
  Tensor dout = Tensor::empty({1, 4}, DType::f32);
  dout.fill(1.0);
  Tensor dgu = test::on_device(ctx, poisoned({1, 8}, DType::f32));
  Tensor dgu_ref = poisoned({1, 8}, DType::f32);
  swiglu_backward(ctx, test::on_device(ctx, dout), test::on_device(ctx, gu), dgu);
  swiglu_backward(ref, dout, gu, dgu_ref);
  EXPECT_TRUE(test::all_close(test::on_host(dgu), dgu_ref, kF32));
}

TEST(SwiGlu, ExtremeGatesStayFinite) {
  Context cpu(Backend::cpu);
  swiglu_extreme_gates(cpu);
}

TEST(SwiGlu, CudaExtremeGatesStayFinite) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  swiglu_extreme_gates(gpu);
}

TEST(SwiGlu, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 3, F = 5;
  Tensor gu = random_tensor({T, 2 * F}, DType::f64, "fd_gu", -3.0f, 3.0f);
  Tensor weights = random_tensor({T, F}, DType::f64, "fd_weights");
  Tensor out = Tensor::empty({T, F}, DType::f64);
  auto loss = [&] {
    swiglu_forward(ref, gu, out);
    return weighted_sum(out, weights);
  };
  Tensor dgu = Tensor::empty({T, 2 * F}, DType::f64);
  swiglu_backward(ref, weights, gu, dgu);
  EXPECT_TRUE(test::finite_difference_check(loss, gu, dgu));
}

TEST(Softmax, CpuMatchesReferenceForwardAndBackward) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    const auto tol = dt == DType::f32 ? kSoftmaxF32 : kSoftmaxBf16;
    for (int64_t R : test::kAwkwardSizes) {
      for (int64_t C : test::kAwkwardSizes) {
        for (float range : {4.0f, 90.0f}) {  // 90: exp(x) alone would overflow fp32
          SCOPED_TRACE(testing::Message()
                       << dtype_name(dt) << " R=" << R << " C=" << C << " range=" << range);
          Tensor x = random_tensor({R, C}, dt, "x", -range, range);
          Tensor y = poisoned({R, C}, dt), y_ref = poisoned({R, C}, dt);
          softmax_forward(cpu, x, y);
          softmax_forward(ref, x, y_ref);
          EXPECT_TRUE(test::all_close(y, y_ref, tol));

          // Both backends get the reference y, so only the backward differs.
          Tensor dy = random_tensor({R, C}, dt, "dy");
          Tensor dx = poisoned({R, C}, dt), dx_ref = poisoned({R, C}, dt);
          softmax_backward(cpu, dy, y_ref, dx);
          softmax_backward(ref, dy, y_ref, dx_ref);
          // dx = y * (dy - dot) cancels where dy ~ dot; floor relative to max|y|.
          EXPECT_TRUE(test::all_close(dx, dx_ref, {tol.rtol, tol.rtol * 1e-2}));
          // In place: dx aliases dy.
          Tensor g = dy.clone();
          softmax_backward(cpu, g, y_ref, g);
          EXPECT_TRUE(test::all_close(g, dx, {0, 0}));
        }
      }
    }
  }
}

TEST(Softmax, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t R = 3, C = 6;
  Tensor x = random_tensor({R, C}, DType::f64, "fd_x", -2.0f, 2.0f);
  Tensor weights = random_tensor({R, C}, DType::f64, "fd_weights");
  Tensor y = Tensor::empty({R, C}, DType::f64);
  auto loss = [&] {
    softmax_forward(ref, x, y);
    return weighted_sum(y, weights);
  };
  loss();
  Tensor dx = Tensor::empty({R, C}, DType::f64);
  softmax_backward(ref, weights, y, dx);
  EXPECT_TRUE(test::finite_difference_check(loss, x, dx));
}

TEST(Activation, BadInputsAreErrors) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor gu = Tensor::zeros({4, 6}, DType::f32), out = Tensor::zeros({4, 3}, DType::f32);
  Tensor x = Tensor::zeros({4, 5}, DType::f32);
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(swiglu_forward(*ctx, Tensor::zeros({4, 5}, DType::f32), out), Error);  // odd 2F
    EXPECT_THROW(swiglu_forward(*ctx, gu, Tensor::zeros({4, 6}, DType::f32)), Error);
    EXPECT_THROW(swiglu_forward(*ctx, gu, Tensor::zeros({4, 3}, DType::bf16)), Error);
    EXPECT_THROW(swiglu_backward(*ctx, out, gu, out), Error);  // d_gate_up too small
    EXPECT_THROW(softmax_forward(*ctx, x, Tensor::zeros({4, 6}, DType::f32)), Error);
    EXPECT_THROW(softmax_forward(*ctx, x.reshape({20}), x.reshape({20})), Error);
    EXPECT_THROW(softmax_backward(*ctx, Tensor::zeros({4, 5}, DType::bf16), x, x), Error);
  }
  // f16 is staged through the f32 kernels (kernels/f16_staging.h); f64 is
  // the reference backend's alone.
  Tensor xd = Tensor::zeros({4, 5}, DType::f64);
  EXPECT_THROW(softmax_forward(cpu, xd, xd), Error);
  Tensor gud = Tensor::zeros({4, 6}, DType::f64);
  EXPECT_THROW(swiglu_forward(cpu, gud, Tensor::zeros({4, 3}, DType::f64)), Error);
}

}  // namespace
}  // namespace moetron::kernels
