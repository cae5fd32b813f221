// moe_combine_weight_grad (the combine weights' gradient formed from the
// down projection's input side, recompute module moe_out): CPU against the
// fp64 reference on awkward sizes with capacity drops, and the identity it
// relies on, d_act . act = dout . expert_out, checked in f64 against
// moe_unpermute_backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/moe_test_util.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/moe.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

Tensor random_topk_idx(int64_t T, int64_t E, int64_t K, const std::string& name) {
  return test_moe::random_topk_idx(T, E, K, name, 9);
}

TEST(MoeCombineWeightGrad, CpuMatchesReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  // bf16 rows: one rounding of a product each side, at most one ulp apart.
  const test::Tolerance f32_tol{1e-6, 1e-7}, bf16_tol{8e-3, 1e-3};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t T : test::kAwkwardSizes) {
      for (int64_t F : {1, 17, 130}) {
        for (bool with_eo : {true, false}) {
          const int64_t E = 5, K = 2, D = 19;
          const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T) +
                                   " F=" + std::to_string(F) + (with_eo ? " d_expert_out" : "");
          const MoePlan plan =
              moe_plan(random_topk_idx(T, E, K, what), E, std::max<int64_t>(1, T * K / E / 2));
          const int64_t R = plan.rows() + 2;
          Tensor act = random_tensor({R, F}, dt, "act" + what);
          Tensor w = random_tensor({T, K}, DType::f32, "w" + what);
          Tensor g = random_tensor({R, F}, dt, "g" + what);
          Tensor eo = random_tensor({R, D}, dt, "eo" + what);
          Tensor g_cpu = g.clone(), g_ref = g.clone();
          Tensor eo_cpu = with_eo ? eo.clone() : Tensor(), eo_ref = with_eo ? eo.clone() : Tensor();
          Tensor dw = poisoned({T, K}, DType::f32), dw_ref = poisoned({T, K}, DType::f32);
          moe_combine_weight_grad(cpu, act, plan, w, g_cpu, eo_cpu, dw);
          moe_combine_weight_grad(ref, act, plan, w, g_ref, eo_ref, dw_ref);
          const test::Tolerance tol = dt == DType::f32 ? f32_tol : bf16_tol;
          EXPECT_TRUE(test::all_close(g_cpu, g_ref, tol)) << "d_act " << what;
          if (with_eo) {
            EXPECT_TRUE(test::all_close(eo_cpu, eo_ref, tol)) << "d_expert_out " << what;
          }
          EXPECT_TRUE(test::normalized_close(dw, dw_ref, 1e-5)) << "d_topk_weight " << what;
          for (int64_t s = 0; s < T * K; ++s) {
            if (plan.row_of_slot[static_cast<size_t>(s)] < 0) {
              EXPECT_EQ(dw.data<float>()[s], 0.0f) << "dropped slot " << s << " " << what;
            }
          }
          // Rows past the plan's are not the kernel's: left as they came.
          for (int64_t i = plan.rows() * F; i < R * F; ++i) {
            ASSERT_EQ(test::element(g_cpu, i), test::element(g, i)) << "spare row " << what;
          }
        }
      }
    }
  }
}

// With expert_out = act W2^T and d_act = dout W2 (unweighted), the kernel's
// weight gradient is moe_unpermute_backward's and its scaled rows are the
// weighted gradients: the algebra the moe_out recompute relies on.
TEST(MoeCombineWeightGrad, EqualsTheUnpermuteBackwardOfTheExpertOutputs) {
  Context ref(Backend::reference);
  const int64_t T = 11, E = 3, K = 2, D = 7, F = 9;
  const MoePlan plan = moe_plan(random_topk_idx(T, E, K, "identity"), E, 6);
  ASSERT_GT(plan.dropped, 0);
  const int64_t R = plan.rows();
  auto f64 = [](const Tensor& t) { return test::to_dtype(t, DType::f64); };
  Tensor act = f64(random_tensor({R, F}, DType::f32, "act"));
  Tensor w2 = f64(random_tensor({D, F}, DType::f32, "w2"));
  Tensor w = f64(random_tensor({T, K}, DType::f32, "w"));
  Tensor dout = f64(random_tensor({T, D}, DType::f32, "dout"));
  const double* a = act.data<double>();
  const double* m = w2.data<double>();
  Tensor eo = Tensor::zeros({R, D}, DType::f64), g = Tensor::zeros({R, F}, DType::f64);
  Tensor d_rows = Tensor::zeros({R, D}, DType::f64);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = plan.token_of_row[static_cast<size_t>(r)];
    for (int64_t d = 0; d < D; ++d) {
      d_rows.data<double>()[r * D + d] = dout.data<double>()[t * D + d];
      for (int64_t f = 0; f < F; ++f) {
        eo.data<double>()[r * D + d] += a[r * F + f] * m[d * F + f];
        g.data<double>()[r * F + f] += dout.data<double>()[t * D + d] * m[d * F + f];
      }
    }
  }
  Tensor deo = poisoned({R, D}, DType::f64), dw = poisoned({T, K}, DType::f64);
  moe_unpermute_backward(ref, dout, eo, plan, w, deo, dw);
  Tensor dw2 = poisoned({T, K}, DType::f64);
  moe_combine_weight_grad(ref, act, plan, w, g, d_rows, dw2);
  EXPECT_TRUE(test::all_close(dw2, dw, {1e-12, 1e-12}));
  EXPECT_TRUE(test::all_close(d_rows, deo, {1e-12, 1e-12}));
  // Finite differences of loss = dout . unpermute(act W2^T, w): the kernel's
  // d_topk_weight and weighted d_act are its gradients in w and act.
  auto loss = [&] {
    Tensor e = Tensor::zeros({R, D}, DType::f64), out = Tensor::zeros({T, D}, DType::f64);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t f = 0; f < F; ++f) {
          e.data<double>()[r * D + d] += act.data<double>()[r * F + f] * m[d * F + f];
        }
      }
    }
    moe_unpermute(ref, e, plan, w, out);
    double sum = 0;
    for (int64_t i = 0; i < T * D; ++i) sum += out.data<double>()[i] * dout.data<double>()[i];
    return sum;
  };
  EXPECT_TRUE(test::finite_difference_check(loss, w, dw2, 1e-6, 1e-7));
  EXPECT_TRUE(test::finite_difference_check(loss, act, g, 1e-6, 1e-7));
  for (int64_t s = 0; s < T * K; ++s) {
    const int32_t r = plan.row_of_slot[static_cast<size_t>(s)];
    if (r < 0) continue;
    const double wk = w.data<double>()[s];
    for (int64_t f = 0; f < F; ++f) {
      double raw = 0;
      for (int64_t d = 0; d < D; ++d) raw += dout.data<double>()[s / K * D + d] * m[d * F + f];
      ASSERT_NEAR(g.data<double>()[r * F + f], wk * raw, 1e-12) << "slot " << s;
    }
  }
}

TEST(MoeCombineWeightGrad, BadInputIsAnError) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t T = 7, E = 4, K = 2, F = 5;
  const MoePlan plan = moe_plan(random_topk_idx(T, E, K, "bad"), E, 0);
  Tensor act = Tensor::zeros({plan.rows(), F}, DType::f32);
  Tensor w = Tensor::zeros({T, K}, DType::f32), dw = Tensor::zeros({T, K}, DType::f32);
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(
        moe_combine_weight_grad(*ctx, act, plan, w, Tensor::zeros({plan.rows(), F + 1}, DType::f32),
                                Tensor(), dw),
        Error);
    EXPECT_THROW(
        moe_combine_weight_grad(*ctx, Tensor::zeros({plan.rows() - 1, F}, DType::f32), plan, w,
                                Tensor::zeros({plan.rows() - 1, F}, DType::f32), Tensor(), dw),
        Error);
    EXPECT_THROW(moe_combine_weight_grad(*ctx, act, plan, w, act.clone(), Tensor(),
                                         Tensor::zeros({T, K + 1}, DType::f32)),
                 Error);
    EXPECT_THROW(moe_combine_weight_grad(*ctx, act, plan, w, act.clone(),
                                         Tensor::zeros({plan.rows(), 3}, DType::bf16), dw),
                 Error);
  }
}

}  // namespace
}  // namespace moetron::kernels
