// RMSNorm: CPU and CUDA against the fp64 reference, finite differences of
// the reference backward, deterministic dw across thread counts, bad inputs.
#include "moetron/kernels/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// fp32: y and rstd are a few roundings from the exact value; dx has one
// cancellation (dy*w - xhat*mean) and dw sums up to 130 rows in fp32, so an
// absolute floor of a few 1e-6 on O(1) values covers accumulated rounding.
constexpr test::Tolerance kF32{1e-5, 1e-6};
constexpr test::Tolerance kF32Sum{1e-5, 3e-5};
// bf16 outputs: both backends round once to bf16 (8 significant bits), so a
// value near a rounding tie may land one ulp apart: 2^-7 relative, plus an
// absolute floor for dx entries that cancel to near zero.
constexpr test::Tolerance kBf16{8e-3, 2e-3};

// dx = rstd (dy w - xhat mean(dy w xhat)) cancels when the two terms nearly
// agree: for D = 1 down to rstd dy w eps / (x^2 + eps). fp32 rounding is then
// a few ulps of the terms, not of the result (T 1000, D 1 has an x = -0.07
// whose dx loses 2.7 digits, on the CPU backend as on CUDA). Per element:
// tol as usual plus 8 fp32 ulps of rstd (|dy w| + |xhat| mean|dy w xhat|).
::testing::AssertionResult dx_close(const Tensor& dx, const Tensor& dx_ref, const Tensor& x,
                                    const Tensor& dy, const Tensor& w, const Tensor& rstd,
                                    test::Tolerance tol) {
  const int64_t T = x.dim(0), D = x.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const double r = test::element(rstd, t);
    double mean_abs = 0;
    for (int64_t j = 0; j < D; ++j) {
      mean_abs += std::fabs(test::element(dy, t * D + j) * test::element(w, j) *
                            test::element(x, t * D + j) * r);
    }
    mean_abs /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) {
      const int64_t i = t * D + j;
      const double e = test::element(dx_ref, i), a = test::element(dx, i);
      const double terms = r * (std::fabs(test::element(dy, i) * test::element(w, j)) +
                                std::fabs(test::element(x, i) * r) * mean_abs);
      const double allowed = tol.atol + tol.rtol * std::fabs(e) + 8 * std::ldexp(terms, -24);
      if (!(std::fabs(a - e) <= allowed)) {
        return ::testing::AssertionFailure()
               << "dx[" << t << ", " << j << "] = " << a << ", expected " << e << " (allowed "
               << allowed << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

double weighted_sum(const Tensor& out, const Tensor& weights) {
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += test::element(out, i) * test::element(weights, i);
  return s;
}

TEST(RmsNorm, CpuMatchesReferenceForwardAndBackward) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const float eps = 1e-5f;
  for (DType dt : {DType::f32, DType::bf16}) {
    const auto tol = dt == DType::f32 ? kF32 : kBf16;
    for (int64_t T : test::kAwkwardSizes) {
      for (int64_t D : test::kAwkwardSizes) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T=" << T << " D=" << D);
        Tensor x = random_tensor({T, D}, dt, "x", -2.0f, 2.0f);
        Tensor w = random_tensor({D}, DType::f32, "w", 0.5f, 1.5f);
        Tensor y = poisoned({T, D}, dt), y_ref = poisoned({T, D}, dt);
        Tensor r = poisoned({T}, DType::f32), r_ref = poisoned({T}, DType::f32);
        rmsnorm_forward(cpu, x, w, eps, y, r);
        rmsnorm_forward(ref, x, w, eps, y_ref, r_ref);
        EXPECT_TRUE(test::all_close(r, r_ref, kF32));
        EXPECT_TRUE(test::all_close(y, y_ref, tol));

        Tensor dy = random_tensor({T, D}, dt, "dy");
        Tensor dx = poisoned({T, D}, dt), dx_ref = poisoned({T, D}, dt);
        // dw starts non-zero: the kernel must accumulate, not overwrite.
        Tensor dw = random_tensor({D}, DType::f32, "dw0");
        Tensor dw_ref = dw.clone();
        rmsnorm_backward(cpu, dy, x, w, r_ref, dx, dw);
        rmsnorm_backward(ref, dy, x, w, r_ref, dx_ref, dw_ref);
        EXPECT_TRUE(test::all_close(dx, dx_ref, tol));
        EXPECT_TRUE(test::all_close(dw, dw_ref, kF32Sum));
      }
    }
  }
}

// ctx's backend against the reference on the CPU test's sizes plus rows
// longer than a CUDA block (D 3000) and more rows than a dw chunk (T 1000).
void rmsnorm_matches_reference_past_a_block(Context& ctx) {
  Context ref(Backend::reference);
  const float eps = 1e-5f;
  std::vector<int64_t> sizes = test::kAwkwardSizes;
  sizes.push_back(1000);
  for (DType dt : {DType::f32, DType::bf16}) {
    const auto tol = dt == DType::f32 ? kF32 : kBf16;
    for (int64_t T : sizes) {
      for (int64_t D : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{130}, int64_t{3000}}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T=" << T << " D=" << D);
        Tensor x = random_tensor({T, D}, dt, "x", -2.0f, 2.0f);
        Tensor w = random_tensor({D}, DType::f32, "w", 0.5f, 1.5f);
        Tensor y = test::on_device(ctx, poisoned({T, D}, dt)), y_ref = poisoned({T, D}, dt);
        Tensor r = test::on_device(ctx, poisoned({T}, DType::f32));
        Tensor r_ref = poisoned({T}, DType::f32);
        rmsnorm_forward(ctx, test::on_device(ctx, x), test::on_device(ctx, w), eps, y, r);
        rmsnorm_forward(ref, x, w, eps, y_ref, r_ref);
        EXPECT_TRUE(test::all_close(test::on_host(r), r_ref, kF32));
        EXPECT_TRUE(test::all_close(test::on_host(y), y_ref, tol));

        Tensor dy = random_tensor({T, D}, dt, "dy");
        Tensor dx = test::on_device(ctx, poisoned({T, D}, dt)), dx_ref = poisoned({T, D}, dt);
        Tensor dw_ref = random_tensor({D}, DType::f32, "dw0");  // accumulated into
        Tensor dw = test::on_device(ctx, dw_ref.clone());
        rmsnorm_backward(ctx, test::on_device(ctx, dy), test::on_device(ctx, x),
                         test::on_device(ctx, w), test::on_device(ctx, r_ref), dx, dw);
        rmsnorm_backward(ref, dy, x, w, r_ref, dx_ref, dw_ref);
        EXPECT_TRUE(dx_close(test::on_host(dx), dx_ref, x, dy, w, r_ref, tol));
        // dw sums up to 1000 rows in fp32 (in chunks): the floor grows with the sum.
        EXPECT_TRUE(test::all_close(test::on_host(dw), dw_ref, {1e-5, 3e-5 * (1.0 + T / 100.0)}));
      }
    }
  }
}

TEST(RmsNorm, CpuMatchesReferencePastABlock) {
  Context cpu(Backend::cpu);
  rmsnorm_matches_reference_past_a_block(cpu);
}

TEST(RmsNorm, CudaMatchesReferenceForwardAndBackward) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  rmsnorm_matches_reference_past_a_block(gpu);
  // dw is reduced without atomics: a second run gives the same bits.
  Tensor x = test::on_device(gpu, random_tensor({1000, 130}, DType::f32, "x"));
  Tensor dy = test::on_device(gpu, random_tensor({1000, 130}, DType::f32, "dy"));
  Tensor w = test::on_device(gpu, random_tensor({130}, DType::f32, "w", 0.5f, 1.5f));
  Tensor r = test::on_device(gpu, random_tensor({1000}, DType::f32, "r", 0.5f, 1.5f));
  Tensor dx = test::empty_on(gpu, {1000, 130}, DType::f32);
  Tensor dw1 = test::on_device(gpu, Tensor::zeros({130}, DType::f32));
  Tensor dw2 = test::on_device(gpu, Tensor::zeros({130}, DType::f32));
  rmsnorm_backward(gpu, dy, x, w, r, dx, dw1);
  rmsnorm_backward(gpu, dy, x, w, r, dx, dw2);
  EXPECT_TRUE(test::all_close(test::on_host(dw1), test::on_host(dw2), {0, 0}));
}

TEST(RmsNorm, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 3, D = 7;
  const float eps = 1e-3f;
  Tensor x = random_tensor({T, D}, DType::f64, "fd_x");
  Tensor w = random_tensor({D}, DType::f64, "fd_w", 0.5f, 1.5f);
  Tensor weights = random_tensor({T, D}, DType::f64, "fd_weights");
  Tensor y = Tensor::empty({T, D}, DType::f64), rstd = Tensor::empty({T}, DType::f64);
  auto loss = [&] {
    rmsnorm_forward(ref, x, w, eps, y, rstd);
    return weighted_sum(y, weights);
  };
  loss();
  Tensor dx = Tensor::empty({T, D}, DType::f64), dw = Tensor::zeros({D}, DType::f64);
  rmsnorm_backward(ref, weights, x, w, rstd, dx, dw);
  EXPECT_TRUE(test::finite_difference_check(loss, x, dx));
  EXPECT_TRUE(test::finite_difference_check(loss, w, dw));
}

TEST(RmsNorm, WeightGradientIsIdenticalOnOneAndTwoThreads) {
  const int64_t T = 1000, D = 130;
  Tensor x = random_tensor({T, D}, DType::f32, "x");
  Tensor w = random_tensor({D}, DType::f32, "w", 0.5f, 1.5f);
  Tensor dy = random_tensor({T, D}, DType::f32, "dy");
  Tensor rstd = Tensor::empty({T}, DType::f32), y = Tensor::empty({T, D}, DType::f32);
  Tensor dx1 = poisoned({T, D}, DType::f32), dx2 = poisoned({T, D}, DType::f32);
  Tensor dw1 = Tensor::zeros({D}, DType::f32), dw2 = Tensor::zeros({D}, DType::f32);
  {
    Context one(Backend::cpu, 1);
    rmsnorm_forward(one, x, w, 1e-5f, y, rstd);
    rmsnorm_backward(one, dy, x, w, rstd, dx1, dw1);
  }
  {
    Context two(Backend::cpu, 2);
    rmsnorm_backward(two, dy, x, w, rstd, dx2, dw2);
  }
  EXPECT_EQ(std::memcmp(dw1.raw(), dw2.raw(), dw1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(dx1.raw(), dx2.raw(), dx1.nbytes()), 0);
}

TEST(RmsNorm, BadInputsAreErrors) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor x = Tensor::zeros({4, 8}, DType::f32), y = Tensor::zeros({4, 8}, DType::f32);
  Tensor w = Tensor::zeros({8}, DType::f32), r = Tensor::zeros({4}, DType::f32);
  Tensor dw = Tensor::zeros({8}, DType::f32);
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(rmsnorm_forward(*ctx, x.reshape({32}), w, 1e-5f, y, r), Error);
    EXPECT_THROW(rmsnorm_forward(*ctx, x, Tensor::zeros({7}, DType::f32), 1e-5f, y, r), Error);
    EXPECT_THROW(rmsnorm_forward(*ctx, x, w, 1e-5f, Tensor::zeros({4, 8}, DType::bf16), r), Error);
    EXPECT_THROW(rmsnorm_forward(*ctx, x, w, 1e-5f, y, Tensor::zeros({5}, DType::f32)), Error);
    EXPECT_THROW(rmsnorm_backward(*ctx, Tensor::zeros({4, 7}, DType::f32), x, w, r, y, dw), Error);
    EXPECT_THROW(rmsnorm_backward(*ctx, x, x, w, r, y, Tensor::zeros({9}, DType::f32)), Error);
  }
  // The CPU backend keeps w, rstd and dw in f32 and computes f32/bf16
  // activations (f16 ones are staged through f32: kernels/f16_staging.h).
  EXPECT_THROW(rmsnorm_forward(cpu, x, Tensor::zeros({8}, DType::bf16), 1e-5f, y, r), Error);
  Tensor xd = Tensor::zeros({4, 8}, DType::f64);
  EXPECT_THROW(rmsnorm_forward(cpu, xd, w, 1e-5f, xd, r), Error);
}

}  // namespace
}  // namespace moetron::kernels
