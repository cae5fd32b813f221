// MoE routing (router_topk), planning (moe_plan) and row movement (permute,
// unpermute and their backwards): CPU against the fp64 reference, the
// reference backwards against finite differences, and bad input.
#include "moetron/kernels/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/moe_test_util.h"
#include "moetron/core/rng.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// f32: softmax/sigmoid and a renormalisation are a few roundings of O(1)
// values (the vectorised exp is ~1 ulp), so 1e-5 relative with a small floor.
constexpr test::Tolerance kF32{1e-5, 1e-6};
// bf16 rows: CPU sums in f32 and rounds once, the reference in double and
// rounds once; the two roundings can differ by one bf16 ulp (2^-8 relative).
constexpr test::Tolerance kBf16{8e-3, 1e-3};
// A dot product over D f32 terms vs double: a normalised 1e-5 covers D ~ 100.
constexpr double kDotTol = 1e-5;

std::string router_case(int64_t T, int64_t E, int64_t K, RouterScore s, bool renorm, bool bias) {
  return "T=" + std::to_string(T) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
         (s == RouterScore::softmax ? " softmax" : " sigmoid") + (renorm ? " renorm" : "") +
         (bias ? " bias" : "");
}

std::vector<int64_t> ks_for(int64_t E) {
  std::vector<int64_t> ks = {1, 2, E};
  ks.erase(std::remove_if(ks.begin(), ks.end(), [&](int64_t k) { return k > E; }), ks.end());
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

using test_moe::random_topk_idx;

TEST(Router, CpuMatchesReferenceForwardAndBackward) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (int64_t T : test::kAwkwardSizes) {
    for (int64_t E : {1, 3, 8, 37}) {
      for (int64_t K : ks_for(E)) {
        for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
          for (bool renorm : {false, true}) {
            for (bool with_bias : {false, true}) {
              const std::string what = router_case(T, E, K, score, renorm, with_bias);
              const RouterArgs args{static_cast<int>(K), score, renorm};
              Tensor logits = random_tensor({T, E}, DType::f32, "logits" + what, -3, 3);
              Tensor bias =
                  with_bias ? random_tensor({E}, DType::f32, "bias", -0.5, 0.5) : Tensor();
              Tensor s = poisoned({T, E}, DType::f32), s_ref = poisoned({T, E}, DType::f32);
              Tensor idx = poisoned({T, K}, DType::i32), idx_ref = poisoned({T, K}, DType::i32);
              Tensor w = poisoned({T, K}, DType::f32), w_ref = poisoned({T, K}, DType::f32);
              router_topk(cpu, logits, bias, args, s, idx, w);
              router_topk(ref, logits, bias, args, s_ref, idx_ref, w_ref);
              EXPECT_TRUE(test::all_close(s, s_ref, kF32)) << what;
              EXPECT_TRUE(test::all_close(idx, idx_ref, {0, 0})) << what;
              EXPECT_TRUE(test::all_close(w, w_ref, kF32)) << what;

              Tensor dw = random_tensor({T, K}, DType::f32, "dw" + what);
              for (bool extra : {false, true}) {
                Tensor ds = extra ? random_tensor({T, E}, DType::f32, "ds" + what) : Tensor();
                Tensor dl = poisoned({T, E}, DType::f32), dl_ref = poisoned({T, E}, DType::f32);
                router_topk_backward(cpu, dw, ds, s, idx, w, args, dl);
                router_topk_backward(ref, dw, ds, s, idx, w, args, dl_ref);
                EXPECT_TRUE(test::normalized_close(dl, dl_ref, 1e-5)) << what << " extra=" << extra;
              }
            }
          }
        }
      }
    }
  }
}

TEST(Router, UndefinedTopkWeightGradientUsesOnlyTheExtraScoreGradient) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t T = 33, E = 8;
  const RouterArgs args{2, RouterScore::softmax, true};
  Tensor logits = random_tensor({T, E}, DType::f32, "logits");
  Tensor s = poisoned({T, E}, DType::f32), idx = poisoned({T, 2}, DType::i32);
  Tensor w = poisoned({T, 2}, DType::f32);
  router_topk(cpu, logits, Tensor(), args, s, idx, w);
  Tensor ds = random_tensor({T, E}, DType::f32, "ds");
  Tensor dl = poisoned({T, E}, DType::f32), dl_ref = poisoned({T, E}, DType::f32);
  router_topk_backward(cpu, Tensor(), ds, s, idx, w, args, dl);
  router_topk_backward(ref, Tensor(), ds, s, idx, w, args, dl_ref);
  EXPECT_TRUE(test::normalized_close(dl, dl_ref, 1e-5));
}

TEST(Router, TiesGoToTheLowerExpertIndex) {
  for (Backend b : {Backend::cpu, Backend::reference}) {
    Context ctx(b);
    for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
      // Row 0: all equal; row 1: experts 5 and 2 tie for first, 6 and 1 for third.
      Tensor logits = Tensor::zeros({2, 8}, DType::f32);
      float* x = logits.data<float>() + 8;
      x[5] = x[2] = 2.0f;
      x[6] = x[1] = 1.0f;
      Tensor s = poisoned({2, 8}, DType::f32), idx = poisoned({2, 4}, DType::i32);
      Tensor w = poisoned({2, 4}, DType::f32);
      router_topk(ctx, logits, Tensor(), {4, score, true}, s, idx, w);
      const int32_t* i = idx.data<int32_t>();
      EXPECT_EQ(std::vector<int32_t>(i, i + 4), (std::vector<int32_t>{0, 1, 2, 3}));
      EXPECT_EQ(std::vector<int32_t>(i + 4, i + 8), (std::vector<int32_t>{2, 5, 1, 6}));
      for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(w.data<float>()[k], 0.25f);
    }
  }
}

TEST(Router, BiasChangesTheSelectionButNotTheWeightFormula) {
  for (Backend b : {Backend::cpu, Backend::reference}) {
    Context ctx(b);
    for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
      const int64_t T = 7, E = 8;
      Tensor logits = random_tensor({T, E}, DType::f32, "logits", -1, 1);
      Tensor bias = Tensor::zeros({E}, DType::f32);
      bias.data<float>()[6] = 10.0f;  // expert 6 always chosen first
      Tensor s = poisoned({T, E}, DType::f32), idx = poisoned({T, 2}, DType::i32);
      Tensor w = poisoned({T, 2}, DType::f32);
      router_topk(ctx, logits, bias, {2, score, true}, s, idx, w);
      Tensor s0 = poisoned({T, E}, DType::f32), idx0 = poisoned({T, 2}, DType::i32);
      Tensor w0 = poisoned({T, 2}, DType::f32);
      router_topk(ctx, logits, Tensor(), {2, score, true}, s0, idx0, w0);
      EXPECT_TRUE(test::all_close(s, s0, {0, 0})) << "bias must not change the scores";
      int changed = 0;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t* i = idx.data<int32_t>() + t * 2;
        const int32_t* i0 = idx0.data<int32_t>() + t * 2;
        EXPECT_EQ(i[0], 6);
        changed += (i[0] != i0[0] || i[1] != i0[1]);
        const float* st = s.data<float>() + t * E;
        const float sum = st[i[0]] + st[i[1]];
        for (int k = 0; k < 2; ++k) {
          EXPECT_NEAR(w.data<float>()[t * 2 + k], st[i[k]] / sum, 1e-6)
              << "weights from unbiased scores";
        }
      }
      EXPECT_GT(changed, 0);
    }
  }
}

// loss(logits) = sum_tk c_tk w_tk + sum_te a_te s_te; the router backward
// with d_topk_weight = c and d_scores_extra = a is its gradient.
TEST(Router, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    for (bool renorm : {false, true}) {
      for (bool with_bias : {false, true}) {
        for (auto [E, K] : {std::pair<int64_t, int64_t>{8, 2}, {3, 3}, {5, 1}}) {
          const int64_t T = 5;
          const std::string what = router_case(T, E, K, score, renorm, with_bias);
          const RouterArgs args{static_cast<int>(K), score, renorm};
          // Logits a shuffled ladder with step 0.4: selection gaps stay far
          // above the finite-difference step.
          Tensor idx0 = random_topk_idx(T, E, E, "ladder" + what);
          Tensor logits = Tensor::empty({T, E}, DType::f64);
          for (int64_t i = 0; i < T * E; ++i) {
            logits.data<double>()[i] = -1.0 + 0.4 * idx0.data<int32_t>()[i];
          }
          Tensor bias = Tensor::zeros({E}, DType::f64);
          if (with_bias) bias.data<double>()[0] = 0.05;  // small: keeps the gaps, still a bias
          Tensor c = test::to_dtype(random_tensor({T, K}, DType::f32, "c" + what), DType::f64);
          Tensor a = test::to_dtype(random_tensor({T, E}, DType::f32, "a" + what), DType::f64);
          Tensor s = poisoned({T, E}, DType::f64), idx = poisoned({T, K}, DType::i32);
          Tensor w = poisoned({T, K}, DType::f64);
          const Tensor b = with_bias ? bias : Tensor();
          auto loss = [&] {
            router_topk(ref, logits, b, args, s, idx, w);
            double l = 0;
            for (int64_t i = 0; i < T * K; ++i) l += c.data<double>()[i] * w.data<double>()[i];
            for (int64_t i = 0; i < T * E; ++i) l += a.data<double>()[i] * s.data<double>()[i];
            return l;
          };
          loss();
          Tensor dl = poisoned({T, E}, DType::f64);
          router_topk_backward(ref, c, a, s, idx, w, args, dl);
          EXPECT_TRUE(test::finite_difference_check(loss, logits, dl, 1e-6, 1e-6)) << what;
        }
      }
    }
  }
}

TEST(MoePlan, DroplessGroupsSlotsByExpertWithTokensAscending) {
  // T = 4, K = 2, E = 3.
  Tensor idx = Tensor::empty({4, 2}, DType::i32);
  const int32_t v[] = {2, 0, 0, 1, 2, 1, 0, 2};
  std::copy(v, v + 8, idx.data<int32_t>());
  const MoePlan p = moe_plan(idx, 3, 0);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 3, 5, 8}));
  EXPECT_EQ(p.token_of_row, (std::vector<int32_t>{0, 1, 3, 1, 2, 0, 2, 3}));
  EXPECT_EQ(p.row_of_slot, (std::vector<int32_t>{5, 0, 1, 3, 6, 4, 2, 7}));
  EXPECT_EQ(p.dropped, 0);
  EXPECT_EQ(p.rows(), 8);
}

TEST(MoePlan, CapacityKeepsEarlierTokensAndCountsDrops) {
  // Expert 0 is picked by tokens 0, 1, 2, 3; with capacity 2 tokens 2 and 3 drop it.
  Tensor idx = Tensor::empty({4, 2}, DType::i32);
  const int32_t v[] = {0, 1, 1, 0, 0, 2, 2, 0};
  std::copy(v, v + 8, idx.data<int32_t>());
  const MoePlan p = moe_plan(idx, 3, 2);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(p.token_of_row, (std::vector<int32_t>{0, 1, 0, 1, 2, 3}));
  // Slots (2, 0) and (3, 1) are dropped, everything else kept.
  EXPECT_EQ(p.row_of_slot, (std::vector<int32_t>{0, 2, 3, 1, -1, 4, 5, -1}));
  EXPECT_EQ(p.dropped, 2);
}

TEST(MoePlan, RejectsBadInput) {
  Tensor idx = Tensor::zeros({3, 2}, DType::i32);
  idx.data<int32_t>()[3] = 4;
  EXPECT_THROW(moe_plan(idx, 4, 0), Error);
  idx.data<int32_t>()[3] = -1;
  EXPECT_THROW(moe_plan(idx, 4, 0), Error);
  EXPECT_THROW(moe_plan(Tensor::zeros({3, 2}, DType::i64), 4, 0), Error);
  EXPECT_THROW(moe_plan(Tensor::zeros({6}, DType::i32), 4, 0), Error);
  EXPECT_THROW(moe_plan(Tensor::zeros({3, 2}, DType::i32), 0, 0), Error);
}

// Permute, unpermute and both backwards, CPU vs reference, over awkward sizes,
// dropless and with capacity drops, f32 and bf16. Expert-major buffers have
// 3 spare rows that must stay untouched (poisoned).
TEST(MoeRows, CpuMatchesReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    const auto tol = dt == DType::f32 ? kF32 : kBf16;
    for (int64_t T : test::kAwkwardSizes) {
      for (int64_t E : {1, 3, 8}) {
        for (int64_t K : ks_for(E)) {
          for (int64_t D : {1, 17, 130}) {
            for (int64_t cap : {int64_t{0}, std::max<int64_t>(1, T * K / E / 2)}) {
              const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T) +
                                       " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                                       " D=" + std::to_string(D) + " cap=" + std::to_string(cap);
              const MoePlan plan = moe_plan(random_topk_idx(T, E, K, what), E, cap);
              const int64_t R = plan.rows() + 3;
              Tensor x = random_tensor({T, D}, dt, "x" + what);
              Tensor w = random_tensor({T, K}, DType::f32, "w" + what);
              Tensor perm = poisoned({R, D}, dt), perm_ref = poisoned({R, D}, dt);
              moe_permute(cpu, x, plan, perm);
              moe_permute(ref, x, plan, perm_ref);
              EXPECT_TRUE(test::all_close(perm, perm_ref, {0, 0})) << "permute " << what;

              Tensor dperm = random_tensor({R, D}, dt, "dp" + what);
              Tensor dx = poisoned({T, D}, dt), dx_ref = poisoned({T, D}, dt);
              moe_permute_backward(cpu, dperm, plan, dx);
              moe_permute_backward(ref, dperm, plan, dx_ref);
              EXPECT_TRUE(test::all_close(dx, dx_ref, tol)) << "permute_backward " << what;

              Tensor eo = random_tensor({R, D}, dt, "eo" + what);
              Tensor out = poisoned({T, D}, dt), out_ref = poisoned({T, D}, dt);
              moe_unpermute(cpu, eo, plan, w, out);
              moe_unpermute(ref, eo, plan, w, out_ref);
              EXPECT_TRUE(test::all_close(out, out_ref, tol)) << "unpermute " << what;

              Tensor dout = random_tensor({T, D}, dt, "do" + what);
              Tensor deo = poisoned({R, D}, dt), deo_ref = poisoned({R, D}, dt);
              Tensor dw = poisoned({T, K}, DType::f32), dw_ref = poisoned({T, K}, DType::f32);
              moe_unpermute_backward(cpu, dout, eo, plan, w, deo, dw);
              moe_unpermute_backward(ref, dout, eo, plan, w, deo_ref, dw_ref);
              EXPECT_TRUE(test::all_close(deo, deo_ref, tol)) << "d_expert_out " << what;
              EXPECT_TRUE(test::normalized_close(dw, dw_ref, kDotTol)) << "d_topk_weight " << what;
              for (int64_t i = plan.rows() * D; i < R * D; ++i) {
                ASSERT_TRUE(std::isnan(test::element(perm, i)) && std::isnan(test::element(deo, i)))
                    << "a spare row was written " << what;
              }
              for (int64_t s = 0; s < T * K; ++s) {
                if (plan.row_of_slot[static_cast<size_t>(s)] < 0) {
                  EXPECT_EQ(dw.data<float>()[s], 0.0f) << "dropped slot " << s << " " << what;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(MoeRows, UndefinedGradientsAreSkipped) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t T = 33, E = 8, K = 2, D = 17;
  const MoePlan plan = moe_plan(random_topk_idx(T, E, K, "skip"), E, 0);
  Tensor eo = random_tensor({plan.rows(), D}, DType::f32, "eo");
  Tensor w = random_tensor({T, K}, DType::f32, "w"), dout = random_tensor({T, D}, DType::f32, "do");
  for (Context* ctx : {&cpu, &ref}) {
    Tensor deo = poisoned({plan.rows(), D}, DType::f32), dw = poisoned({T, K}, DType::f32);
    Tensor deo2 = poisoned({plan.rows(), D}, DType::f32), dw2 = poisoned({T, K}, DType::f32);
    moe_unpermute_backward(*ctx, dout, eo, plan, w, deo, dw);
    moe_unpermute_backward(*ctx, dout, eo, plan, w, deo2, Tensor());
    moe_unpermute_backward(*ctx, dout, eo, plan, w, Tensor(), dw2);
    EXPECT_TRUE(test::all_close(deo2, deo, {0, 0}));
    EXPECT_TRUE(test::all_close(dw2, dw, {0, 0}));
  }
}

TEST(MoeRows, ResultsDoNotDependOnTheThreadCount) {
  const int64_t T = 2000, E = 8, K = 2, D = 64;
  Tensor logits = random_tensor({T, E}, DType::f32, "logits", -3, 3);
  const MoePlan plan = moe_plan(random_topk_idx(T, E, K, "det"), E, 0);
  Tensor eo = random_tensor({plan.rows(), D}, DType::bf16, "eo");
  Tensor w = random_tensor({T, K}, DType::f32, "w"),
         dout = random_tensor({T, D}, DType::bf16, "do");
  std::vector<std::vector<double>> results[2];
  for (int threads : {1, 2}) {
    Context cpu(Backend::cpu, threads);
    Tensor s = poisoned({T, E}, DType::f32), idx = poisoned({T, K}, DType::i32);
    Tensor tw = poisoned({T, K}, DType::f32), dl = poisoned({T, E}, DType::f32);
    router_topk(cpu, logits, Tensor(), {2, RouterScore::softmax, true}, s, idx, tw);
    router_topk_backward(cpu, w, Tensor(), s, idx, tw, {2, RouterScore::softmax, true}, dl);
    Tensor out = poisoned({T, D}, DType::bf16), deo = poisoned({plan.rows(), D}, DType::bf16);
    Tensor dw = poisoned({T, K}, DType::f32);
    moe_unpermute(cpu, eo, plan, w, out);
    moe_unpermute_backward(cpu, dout, eo, plan, w, deo, dw);
    for (const Tensor* t : {&s, &tw, &dl, &out, &deo, &dw}) {
      results[threads - 1].push_back(test::to_doubles(*t));
    }
  }
  EXPECT_EQ(results[0], results[1]);
}

// The row movers are linear; their backwards are checked as gradients of
// sum(out * fixed weights) on f64 tensors, with capacity drops.
TEST(MoeRows, ReferenceBackwardsMatchFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 6, E = 3, K = 2, D = 5;
  const MoePlan plan = moe_plan(random_topk_idx(T, E, K, "fd"), E, 3);
  ASSERT_GT(plan.dropped, 0);
  const int64_t R = plan.rows();
  auto f64 = [](const Tensor& t) { return test::to_dtype(t, DType::f64); };
  Tensor x = f64(random_tensor({T, D}, DType::f32, "x"));
  Tensor eo = f64(random_tensor({R, D}, DType::f32, "eo"));
  Tensor w = f64(random_tensor({T, K}, DType::f32, "w"));
  Tensor cp = f64(random_tensor({R, D}, DType::f32, "cp"));
  Tensor co = f64(random_tensor({T, D}, DType::f32, "co"));
  auto dot = [](const Tensor& a, const Tensor& b) {
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
    return s;
  };
  Tensor perm = poisoned({R, D}, DType::f64), out = poisoned({T, D}, DType::f64);
  auto permute_loss = [&] {
    moe_permute(ref, x, plan, perm);
    return dot(perm, cp);
  };
  Tensor dx = poisoned({T, D}, DType::f64);
  moe_permute_backward(ref, cp, plan, dx);
  EXPECT_TRUE(test::finite_difference_check(permute_loss, x, dx, 1e-6, 1e-7));

  auto unpermute_loss = [&] {
    moe_unpermute(ref, eo, plan, w, out);
    return dot(out, co);
  };
  Tensor deo = poisoned({R, D}, DType::f64), dw = poisoned({T, K}, DType::f64);
  moe_unpermute_backward(ref, co, eo, plan, w, deo, dw);
  EXPECT_TRUE(test::finite_difference_check(unpermute_loss, eo, deo, 1e-6, 1e-7));
  EXPECT_TRUE(test::finite_difference_check(unpermute_loss, w, dw, 1e-6, 1e-7));
}

TEST(Moe, BadInputIsAnError) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t T = 7, E = 4, D = 5;
  Tensor logits = random_tensor({T, E}, DType::f32, "l");
  Tensor s = Tensor::zeros({T, E}, DType::f32), idx = Tensor::zeros({T, 2}, DType::i32);
  Tensor w = Tensor::zeros({T, 2}, DType::f32);
  const RouterArgs args{2, RouterScore::softmax, true};
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(router_topk(*ctx, logits, Tensor(), {5, RouterScore::softmax, true}, s, idx, w),
                 Error);
    EXPECT_THROW(router_topk(*ctx, logits, Tensor(), {0, RouterScore::softmax, true}, s, idx, w),
                 Error);
    EXPECT_THROW(router_topk(*ctx, logits, Tensor::zeros({E + 1}, DType::f32), args, s, idx, w),
                 Error);
    EXPECT_THROW(router_topk(*ctx, logits, Tensor(), args, s, Tensor::zeros({T, 2}, DType::i64), w),
                 Error);
    EXPECT_THROW(
        router_topk(*ctx, logits, Tensor(), args, Tensor::zeros({T, E + 1}, DType::f32), idx, w),
        Error);
    EXPECT_THROW(
        router_topk_backward(*ctx, w, Tensor(), s, idx, w, args, Tensor::zeros({T, 3}, DType::f32)),
        Error);
    EXPECT_THROW(
        router_topk_backward(*ctx, Tensor::zeros({T, 3}, DType::f32), Tensor(), s, idx, w, args, s),
        Error);
  }
  // The CPU router is f32 only; the reference also takes f64.
  EXPECT_THROW(router_topk(cpu, test::to_dtype(logits, DType::bf16), Tensor(), args, s, idx, w),
               Error);

  const MoePlan plan = moe_plan(random_topk_idx(T, E, 2, "bad"), E, 0);
  Tensor x = random_tensor({T, D}, DType::f32, "x");
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(moe_permute(*ctx, x, plan, Tensor::zeros({plan.rows() - 1, D}, DType::f32)),
                 Error);
    EXPECT_THROW(moe_permute(*ctx, x, plan, Tensor::zeros({plan.rows(), D + 1}, DType::f32)),
                 Error);
    EXPECT_THROW(moe_permute(*ctx, x, plan, Tensor::zeros({plan.rows(), D}, DType::bf16)), Error);
    EXPECT_THROW(moe_permute(*ctx, Tensor::zeros({T + 1, D}, DType::f32), plan,
                             Tensor::zeros({plan.rows(), D}, DType::f32)),
                 Error);
    EXPECT_THROW(moe_unpermute(*ctx, Tensor::zeros({plan.rows(), D}, DType::f32), plan,
                               Tensor::zeros({T, 3}, DType::f32), x),
                 Error);
    MoePlan broken = plan;
    broken.row_of_slot.pop_back();
    EXPECT_THROW(moe_permute_backward(*ctx, Tensor::zeros({plan.rows(), D}, DType::f32), broken, x),
                 Error);
  }
  EXPECT_THROW(moe_permute(cpu, test::to_dtype(x, DType::f64), plan,
                           Tensor::zeros({plan.rows(), D}, DType::f64)),
               Error);
}

}  // namespace
}  // namespace moetron::kernels
