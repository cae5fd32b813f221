// CPU elementwise kernels against the fp64 reference.
#include "moetron/kernels/elementwise.h"

#include <gtest/gtest.h>

#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// bf16 keeps 8 significant bits: one rounding of the result is <= 2^-8 relative.
constexpr test::Tolerance kF32{1e-6, 1e-7};
constexpr test::Tolerance kBf16{4e-3, 1e-3};

TEST(Elementwise, AddScaleAxpyMatchReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    const auto tol = dt == DType::f32 ? kF32 : kBf16;
    for (int64_t n : {1, 7, 33, 130, 70001}) {
      Tensor a = random_tensor({n}, dt, "a"), b = random_tensor({n}, dt, "b");
      Tensor out = poisoned({n}, dt), expect = poisoned({n}, dt);
      add(cpu, a, b, out);
      add(ref, a, b, expect);
      EXPECT_TRUE(test::all_close(out, expect, tol)) << "add n=" << n;
      scale(cpu, a, -0.37f, out);
      scale(ref, a, -0.37f, expect);
      EXPECT_TRUE(test::all_close(out, expect, tol)) << "scale n=" << n;
      Tensor y = random_tensor({n}, DType::f32, "y");
      Tensor y2 = y.clone();
      axpy(cpu, 1.5f, a, y);
      axpy(ref, 1.5f, a, y2);
      EXPECT_TRUE(test::all_close(y, y2, kF32)) << "axpy n=" << n;
    }
  }
}

TEST(Elementwise, ConversionsRoundToNearestEvenLikeReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (int64_t n : {1, 7, 33, 130, 4099}) {
    Tensor x = random_tensor({n}, DType::f32, "x", -100.0f, 100.0f);
    for (DType dt : {DType::bf16, DType::f16}) {
      Tensor out = poisoned({n}, dt), expect = poisoned({n}, dt);
      convert(cpu, x, out);
      convert(ref, x, expect);
      // Exactly equal: both round once to nearest even.
      EXPECT_TRUE(test::all_close(out, expect, {0, 0})) << dtype_name(dt) << " n=" << n;
      Tensor back = poisoned({n}, DType::f32), back_ref = poisoned({n}, DType::f32);
      convert(cpu, out, back);
      convert(ref, out, back_ref);
      EXPECT_TRUE(test::all_close(back, back_ref, {0, 0}));
    }
  }
}

TEST(Elementwise, SumSquaresMatchesReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (int64_t n : {1, 7, 33, 130, 100003}) {
    Tensor x = random_tensor({n}, DType::f32, "x");
    const double expect = sum_squares(ref, x);
    EXPECT_NEAR(sum_squares(cpu, x), expect, 1e-6 * expect) << n;
    Tensor xb = test::to_dtype(x, DType::bf16);
    const double expect_b = sum_squares(ref, xb);
    EXPECT_NEAR(sum_squares(cpu, xb), expect_b, 1e-6 * expect_b) << n;
  }
}

TEST(Elementwise, SumSquaredDifferenceMatchesReferenceAndTheDifferenceTensor) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (int64_t n : {1, 7, 33, 130, 100003}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor a = test::to_dtype(random_tensor({n}, DType::f32, "a"), dt);
      Tensor b = test::to_dtype(random_tensor({n}, DType::f32, "b"), dt);
      const double expect = sum_squared_difference(ref, a, b);
      EXPECT_NEAR(sum_squared_difference(cpu, a, b), expect, 1e-9 * expect)
          << dtype_name(dt) << " n=" << n;
      // The same as materialising a - b in f32 and summing its squares.
      Tensor diff = test::to_dtype(a, DType::f32);
      axpy(ref, -1.0f, b, diff);
      EXPECT_NEAR(expect, sum_squares(ref, diff), 1e-6 * expect) << dtype_name(dt) << " n=" << n;
      EXPECT_EQ(sum_squared_difference(cpu, a, a), 0.0);
    }
  }
  Tensor x = Tensor::zeros({4}, DType::f32), y = Tensor::zeros({5}, DType::f32);
  EXPECT_THROW(sum_squared_difference(cpu, x, y), Error);
  EXPECT_THROW(sum_squared_difference(cpu, x, test::to_dtype(x, DType::bf16)), Error);
}

TEST(Elementwise, MismatchedSizesAreErrors) {
  Context cpu(Backend::cpu);
  Tensor a = Tensor::zeros({3}, DType::f32), b = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(add(cpu, a, b, a), Error);
}

}  // namespace
}  // namespace moetron::kernels
