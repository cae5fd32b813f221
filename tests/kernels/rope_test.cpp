// RoPE: CPU against the fp64 reference (positions up to 4096), in-place use,
// finite differences of the reference backward, bad inputs.
#include "moetron/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

constexpr float kTheta = 10000.0f;

// Positions spread over [0, max_pos], including both ends.
Tensor make_positions(int64_t T, int32_t max_pos) {
  Tensor p = Tensor::empty({T}, DType::i32);
  int32_t* d = p.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) d[t] = static_cast<int32_t>((t * 977 + 13) % (max_pos + 1));
  d[0] = 0;
  if (T > 1) d[T - 1] = max_pos;
  return p;
}

// The CPU forms each angle in fp32: a = fl(p * fl(inv_freq)), two roundings
// of 2^-24 relative each, so |da| <= 2^-23 * p * inv_freq <= 2^-23 * max_pos
// (inv_freq <= 1). A rotation error da moves the output pair by at most
// da * |(x_i, x_{i+hd/2})| <= da * sqrt(2) * max|x| (max|x| = 1 here). At
// max_pos 4096 that is 6.9e-4: the angle, not the arithmetic, sets the
// fp32 tolerance at large positions. 1e-6 covers sincos and the FMAs.
double angle_atol(int32_t max_pos) {
  return std::ldexp(1.0, -23) * max_pos * std::sqrt(2.0) + 1e-6;
}
// bf16 outputs: both backends round once to 8 significant bits (one ulp
// apart near ties, 2^-7 relative) on top of the angle error.
constexpr double kBf16Rtol = 8e-3;

struct Dims {
  int64_t T, H, hd;
};

std::vector<Dims> sweep() {
  std::vector<Dims> dims;
  for (int64_t T : test::kAwkwardSizes) {
    for (int64_t H : {1, 7}) {
      // half = hd / 2 takes the awkward sizes 1, 7, 33, 65.
      for (int64_t hd : {2, 14, 66, 130}) dims.push_back({T, H, hd});
    }
  }
  dims.push_back({7, 33, 64});
  return dims;
}

TEST(Rope, CpuMatchesReferenceForwardAndBackward) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int32_t max_pos : {33, 4096}) {
      const double atol = angle_atol(max_pos) + (dt == DType::bf16 ? 1e-3 : 0.0);
      const test::Tolerance tol{dt == DType::f32 ? 1e-5 : kBf16Rtol, atol};
      for (const Dims& d : sweep()) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " max_pos=" << max_pos << " T=" << d.T
                                        << " H=" << d.H << " hd=" << d.hd);
        Tensor pos = make_positions(d.T, max_pos);
        Tensor x = random_tensor({d.T, d.H, d.hd}, dt, "x");
        Tensor y = poisoned({d.T, d.H, d.hd}, dt), y_ref = poisoned({d.T, d.H, d.hd}, dt);
        rope_forward(cpu, x, pos, kTheta, y);
        rope_forward(ref, x, pos, kTheta, y_ref);
        EXPECT_TRUE(test::all_close(y, y_ref, tol));

        Tensor dy = random_tensor({d.T, d.H, d.hd}, dt, "dy");
        Tensor dx = poisoned({d.T, d.H, d.hd}, dt), dx_ref = poisoned({d.T, d.H, d.hd}, dt);
        rope_backward(cpu, dy, pos, kTheta, dx);
        rope_backward(ref, dy, pos, kTheta, dx_ref);
        EXPECT_TRUE(test::all_close(dx, dx_ref, tol));

        // In place (y aliases x) gives the same bits as out of place.
        Tensor inplace = x.clone();
        rope_forward(cpu, inplace, pos, kTheta, inplace);
        EXPECT_TRUE(test::all_close(inplace, y, {0, 0}));
      }
    }
  }
}

TEST(Rope, BackwardInvertsForward) {
  Context cpu(Backend::cpu);
  Tensor pos = make_positions(33, 4096);
  Tensor x = random_tensor({33, 3, 64}, DType::f32, "x");
  Tensor y = poisoned({33, 3, 64}, DType::f32), back = poisoned({33, 3, 64}, DType::f32);
  rope_forward(cpu, x, pos, kTheta, y);
  rope_backward(cpu, y, pos, kTheta, back);
  // The same fp32 angles both ways: only the rounding of the products remains.
  EXPECT_TRUE(test::all_close(back, x, {1e-5, 1e-6}));
}

TEST(Rope, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 3, H = 2, hd = 6;
  Tensor pos = make_positions(T, 50);
  Tensor x = random_tensor({T, H, hd}, DType::f64, "fd_x");
  Tensor weights = random_tensor({T, H, hd}, DType::f64, "fd_weights");
  Tensor y = Tensor::empty({T, H, hd}, DType::f64);
  auto loss = [&] {
    rope_forward(ref, x, pos, kTheta, y);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.data<double>()[i] * weights.data<double>()[i];
    return s;
  };
  Tensor dx = Tensor::empty({T, H, hd}, DType::f64);
  rope_backward(ref, weights, pos, kTheta, dx);
  EXPECT_TRUE(test::finite_difference_check(loss, x, dx));
}

TEST(Rope, BadInputsAreErrors) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor x = Tensor::zeros({4, 2, 8}, DType::f32), pos = make_positions(4, 10);
  for (Context* ctx : {&cpu, &ref}) {
    Tensor odd = Tensor::zeros({4, 2, 7}, DType::f32);
    EXPECT_THROW(rope_forward(*ctx, odd, pos, kTheta, odd), Error);
    EXPECT_THROW(rope_forward(*ctx, x, make_positions(5, 10), kTheta, x), Error);
    EXPECT_THROW(rope_forward(*ctx, x, Tensor::zeros({4}, DType::f32), kTheta, x), Error);
    EXPECT_THROW(rope_forward(*ctx, x, pos, kTheta, Tensor::zeros({4, 2, 8}, DType::bf16)), Error);
    EXPECT_THROW(rope_backward(*ctx, x.reshape({4, 16}), pos, kTheta, x.reshape({4, 16})), Error);
  }
  // f16 is staged through f32 (kernels/f16_staging.h); f64 is reference-only.
  Tensor xd = Tensor::zeros({4, 2, 8}, DType::f64);
  EXPECT_THROW(rope_forward(cpu, xd, pos, kTheta, xd), Error);
}

}  // namespace
}  // namespace moetron::kernels
