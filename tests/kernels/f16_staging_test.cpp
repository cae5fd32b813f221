// fp16 on the CPU backend: f16 tensors are staged through f32 kernels. Each
// result is compared with the reference backend on the same f16 inputs.
// Tolerance: fp16 keeps 11 significant bits, so one rounding of an output is
// <= 2^-11 (4.9e-4) relative; 2e-3 normalised leaves room for the inputs'
// own f32 arithmetic differences.
#include <gtest/gtest.h>

#include "moetron/kernels/attention.h"
#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/moe.h"
#include "moetron/kernels/norm.h"
#include "moetron/kernels/rope.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;
constexpr double kF16Tol = 2e-3;

TEST(F16Staging, MatmulWithBetaAndF32Output) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor a = random_tensor({33, 17}, DType::f16, "a"), b = random_tensor({7, 17}, DType::f16, "b");
  MatmulArgs args;
  args.trans_b = true;
  args.beta = 1.0f;
  Tensor c = random_tensor({33, 7}, DType::f16, "c"), c_ref = c.clone();
  matmul(cpu, a, b, c, args);
  matmul(ref, a, b, c_ref, args);
  EXPECT_TRUE(test::normalized_close(c, c_ref, kF16Tol));
  Tensor c32 = poisoned({33, 7}, DType::f32), c32_ref = poisoned({33, 7}, DType::f32);
  args.beta = 0;
  matmul(cpu, a, b, c32, args);
  matmul(ref, a, b, c32_ref, args);
  EXPECT_TRUE(test::normalized_close(c32, c32_ref, 1e-5));  // products of f16 are exact in f32
}

TEST(F16Staging, NormRopeInPlaceAndAttention) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor x = random_tensor({7, 2, 24}, DType::f16, "x");
  Tensor w = random_tensor({48}, DType::f32, "w");
  Tensor y = poisoned({7, 48}, DType::f16), y_ref = poisoned({7, 48}, DType::f16);
  Tensor r = poisoned({7}, DType::f32), r_ref = poisoned({7}, DType::f32);
  rmsnorm_forward(cpu, x.reshape({7, 48}), w, 1e-5f, y, r);
  rmsnorm_forward(ref, x.reshape({7, 48}), w, 1e-5f, y_ref, r_ref);
  EXPECT_TRUE(test::normalized_close(y, y_ref, kF16Tol));
  Tensor pos = Tensor::empty({7}, DType::i32);
  for (int i = 0; i < 7; ++i) pos.data<int32_t>()[i] = 3 * i;
  Tensor a = x.clone(), b = x.clone();
  rope_forward(cpu, a, pos, 10000.0f, a);  // in place through the staging buffer
  rope_forward(ref, b, pos, 10000.0f, b);
  EXPECT_TRUE(test::normalized_close(a, b, kF16Tol));
  Tensor q = random_tensor({1, 33, 4, 16}, DType::f16, "q"),
         k = random_tensor({1, 33, 2, 16}, DType::f16, "k");
  Tensor v = random_tensor({1, 33, 2, 16}, DType::f16, "v");
  Tensor o = poisoned({1, 33, 4, 16}, DType::f16), o_ref = poisoned({1, 33, 4, 16}, DType::f16);
  Tensor l = poisoned({1, 4, 33}, DType::f32), l_ref = poisoned({1, 4, 33}, DType::f32);
  attention_forward(cpu, q, k, v, {}, 0.25f, o, l);
  attention_forward(ref, q, k, v, {}, 0.25f, o_ref, l_ref);
  EXPECT_TRUE(test::normalized_close(o, o_ref, kF16Tol));
  EXPECT_TRUE(test::normalized_close(l, l_ref, 1e-5));
}

TEST(F16Staging, FusedCrossEntropyAndPermuteKeepUntouchedRows) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor h = random_tensor({13, 8}, DType::f16, "h"), w = random_tensor({33, 8}, DType::f16, "w");
  Tensor tgt = Tensor::empty({13}, DType::i32);
  for (int i = 0; i < 13; ++i) tgt.data<int32_t>()[i] = (i * 5) % 33;
  Tensor l = poisoned({13}, DType::f32), l_ref = poisoned({13}, DType::f32);
  Tensor dh = poisoned({13, 8}, DType::f16), dh_ref = poisoned({13, 8}, DType::f16);
  Tensor dw = Tensor::zeros({33, 8}, DType::f32), dw_ref = Tensor::zeros({33, 8}, DType::f32);
  cross_entropy_fused(cpu, h, w, tgt, 0.1f, 4, l, dh, dw);
  cross_entropy_fused(ref, h, w, tgt, 0.1f, 4, l_ref, dh_ref, dw_ref);
  EXPECT_TRUE(test::normalized_close(l, l_ref, 1e-5));
  EXPECT_TRUE(test::normalized_close(dh, dh_ref, kF16Tol));
  EXPECT_TRUE(test::normalized_close(dw, dw_ref, 1e-4));
  // Permute into a buffer with spare rows: rows past plan.rows() must keep their contents.
  Tensor idx = Tensor::empty({5, 2}, DType::i32);
  for (int i = 0; i < 10; ++i) idx.data<int32_t>()[i] = (i * 3) % 4;
  const MoePlan plan = moe_plan(idx, 4, 0);
  Tensor xs = random_tensor({5, 8}, DType::f16, "xs");
  Tensor perm = random_tensor({12, 8}, DType::f16, "spare"), keep = perm.clone();
  moe_permute(cpu, xs, plan, perm);
  for (int64_t r = plan.rows(); r < 12; ++r) EXPECT_TRUE(test::all_close(perm[r], keep[r], {0, 0}));
  Tensor perm_ref = keep.clone();
  moe_permute(ref, xs, plan, perm_ref);
  EXPECT_TRUE(test::all_close(perm, perm_ref, {0, 0}));  // a pure copy: exact
}

}  // namespace
}  // namespace moetron::kernels
