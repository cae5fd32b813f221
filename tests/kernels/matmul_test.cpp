// CPU matmul family (oneDNN) and CUDA matmul (cuBLASLt) against the fp64
// reference, the reference against finite differences through the
// identities models use, and the shape/dtype errors every backend must raise.
#include "moetron/kernels/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "moetron/kernels/cpu/cpu_state.h"
#include "moetron/kernels/cpu/matmul_gemm.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// fp32 accumulation over K <= 130 products of |x| <= 1: rounding errors grow
// like sqrt(K) * 2^-24 * sum|a b|; 2e-5 of the largest output covers it with
// margin, also for outputs near zero from cancellation.
constexpr double kF32Rel = 2e-5;
// A bf16 output is rounded once by each side; when the two fp32 sums straddle
// a rounding boundary they land one bf16 ulp apart: <= 2^-7 relative.
constexpr double kBf16OutRel = 8e-3;

::testing::AssertionResult close(const Tensor& actual, const Tensor& expected) {
  double max_abs = 0;
  for (double v : test::to_doubles(expected)) max_abs = std::max(max_abs, std::fabs(v));
  const double rtol = actual.dtype() == DType::bf16 ? kBf16OutRel : kF32Rel;
  return test::all_close(actual, expected, {rtol, kF32Rel * max_abs});
}

struct Mnk {
  int64_t m, n, k;
};
// Awkward mixes of 1, 7, 33, 130 along each dimension.
const std::vector<Mnk> kShapes = {{1, 1, 1},    {7, 33, 130}, {130, 7, 33}, {33, 130, 7},
                                  {1, 130, 33}, {130, 1, 7},  {7, 7, 1},    {33, 33, 33}};

// batch dims of a and c, and whether b carries them too.
struct BatchCase {
  Shape batch;
  bool b_batched;
};
const std::vector<BatchCase> kBatches = {
    {{}, false}, {{3}, true}, {{3}, false}, {{2, 3}, true}, {{2, 3}, false}};

Shape with_batch(const Shape& batch, int64_t r, int64_t c) {
  Shape s = batch;
  s.push_back(r);
  s.push_back(c);
  return s;
}

// Every shape, batch layout, trans flag, dtype pair and alpha/beta of ctx's
// backend against the reference; returns the number of cases run.
// all_batched: batched layouts on every shape (fast on a GPU).
int every_variant_matches_reference(Context& ctx, bool all_batched) {
  Context ref(Backend::reference);
  int cases = 0;
  for (const Mnk& sh : kShapes) {
    for (const BatchCase& bc : kBatches) {
      // Batched cases on two shapes only (primitive creation dominates the
      // CPU test's time): the batch logic does not depend on the sizes.
      const bool batched = bc.batch.rank() > 0;
      if (!all_batched && batched && &sh != &kShapes[1] && &sh != &kShapes[2]) continue;
      for (int t = 0; t < 4; ++t) {
        MatmulArgs args;
        args.trans_a = (t & 1) != 0;
        args.trans_b = (t & 2) != 0;
        for (DType in : {DType::f32, DType::bf16}) {
          const Shape sa =
              with_batch(bc.batch, args.trans_a ? sh.k : sh.m, args.trans_a ? sh.m : sh.k);
          const Shape sb = with_batch(bc.b_batched ? bc.batch : Shape{}, args.trans_b ? sh.n : sh.k,
                                      args.trans_b ? sh.k : sh.n);
          Tensor a = random_tensor(sa, in, "a"), b = random_tensor(sb, in, "b");
          const Tensor da = test::on_device(ctx, a), db = test::on_device(ctx, b);
          for (DType out : {DType::f32, DType::bf16}) {
            for (auto [alpha, beta] :
                 {std::pair{1.0f, 0.0f}, std::pair{0.75f, -1.25f}, std::pair{1.0f, 1.0f}}) {
              // Batched: one alpha/beta case per output dtype, poisoned c for bf16.
              if (batched && (beta == 1.0f || (beta == 0.0f) != (out == DType::bf16))) continue;
              args.alpha = alpha;
              args.beta = beta;
              const Shape sc = with_batch(bc.batch, sh.m, sh.n);
              // beta == 0 must not read c: poison it, a NaN read would show.
              Tensor c = beta == 0.0f ? poisoned(sc, out) : random_tensor(sc, out, "c");
              Tensor expect = c.clone();
              const Tensor dc = test::on_device(ctx, c);
              matmul(ctx, da, db, dc, args);
              matmul(ref, a, b, expect, args);
              EXPECT_TRUE(close(test::on_host(dc), expect))
                  << "a " << a.str() << " b " << b.str() << " -> " << c.str() << " trans_a "
                  << args.trans_a << " trans_b " << args.trans_b << " alpha " << alpha << " beta "
                  << beta;
              ++cases;
            }
          }
        }
      }
    }
  }
  return cases;
}

TEST(Matmul, EveryVariantMatchesReference) {
  Context cpu(Backend::cpu);
  EXPECT_EQ(every_variant_matches_reference(cpu, false), 8 * 4 * 2 * 2 * 3 + 2 * 4 * 4 * 2 * 2);
}

TEST(Matmul, CudaEveryVariantMatchesReference) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  EXPECT_EQ(every_variant_matches_reference(gpu, true), 8 * 4 * 2 * 2 * 3 + 8 * 4 * 4 * 2 * 2);
}

// Past the tensor-core tiles in every dimension with ragged edges, and
// operands at odd offsets (slices one row in: 2-byte aligned bf16), which
// cuBLASLt must be told about rather than assume 256-byte alignment.
TEST(Matmul, CudaLargeAndMisalignedMatchReference) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda), ref(Backend::reference);
  for (DType in : {DType::f32, DType::bf16}) {
    for (DType out : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(testing::Message() << dtype_name(in) << " -> " << dtype_name(out));
      Tensor a = random_tensor({301, 517}, in, "a"), b = random_tensor({259, 517}, in, "b");
      MatmulArgs args;
      args.trans_b = true;
      Tensor c = poisoned({300, 257}, out), expect = poisoned({300, 257}, out);
      const Tensor da = test::on_device(gpu, a), db = test::on_device(gpu, b);
      const Tensor dc = test::on_device(gpu, c);
      matmul(gpu, da.slice(1, 301), db.slice(1, 258), dc, args);
      matmul(ref, a.slice(1, 301), b.slice(1, 258), expect, args);
      EXPECT_TRUE(close(test::on_host(dc), expect));
    }
  }
}

TEST(Matmul, CudaEmptyInnerDimensionGivesBetaTimesC) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda), ref(Backend::reference);
  Tensor a = Tensor::zeros({7, 0}, DType::f32), b = Tensor::zeros({0, 5}, DType::f32);
  for (DType out : {DType::f32, DType::bf16}) {
    for (float beta : {0.0f, 0.5f}) {
      Tensor c = beta == 0.0f ? poisoned({7, 5}, out) : random_tensor({7, 5}, out, "c");
      Tensor expect = c.clone();
      MatmulArgs args;
      args.beta = beta;
      const Tensor dc = test::on_device(gpu, c);
      matmul(gpu, test::on_device(gpu, a), test::on_device(gpu, b), dc, args);
      matmul(ref, a, b, expect, args);
      EXPECT_TRUE(close(test::on_host(dc), expect)) << beta;
    }
  }
}

TEST(Matmul, LargerBlockedShapeMatchesReference) {
  // Past oneDNN's register blocks in every dimension, with a ragged edge.
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType in : {DType::f32, DType::bf16}) {
    Tensor a = random_tensor({130, 260}, in, "a"), b = random_tensor({97, 260}, in, "b");
    Tensor c = poisoned({130, 97}, DType::f32), expect = poisoned({130, 97}, DType::f32);
    MatmulArgs args;
    args.trans_b = true;
    matmul(cpu, a, b, c, args);
    matmul(ref, a, b, expect, args);
    EXPECT_TRUE(close(c, expect)) << dtype_name(in);
  }
}

TEST(Matmul, RepeatedCallsReuseTheCachedPrimitive) {
  // The second call hits the cache; it must give the same bits.
  Context cpu(Backend::cpu);
  Tensor a = random_tensor({33, 7}, DType::f32, "a"), b = random_tensor({7, 130}, DType::f32, "b");
  Tensor c1 = poisoned({33, 130}, DType::f32), c2 = poisoned({33, 130}, DType::f32);
  matmul(cpu, a, b, c1, {});
  matmul(cpu, a, b, c2, {});
  EXPECT_TRUE(test::all_close(c1, c2, {0, 0}));
}

TEST(Matmul, EmptyInnerDimensionGivesBetaTimesC) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor a = Tensor::zeros({7, 0}, DType::f32), b = Tensor::zeros({0, 5}, DType::f32);
  for (float beta : {0.0f, 0.5f}) {
    Tensor c = beta == 0.0f ? poisoned({7, 5}, DType::f32) : random_tensor({7, 5}, DType::f32, "c");
    Tensor expect = c.clone();
    MatmulArgs args;
    args.beta = beta;
    matmul(cpu, a, b, c, args);
    matmul(ref, a, b, expect, args);
    EXPECT_TRUE(close(c, expect)) << beta;
  }
}

// Groups: 0 and 2 empty, rows past offsets[E] = 100 belong to no group.
const std::vector<int64_t> kOffsets = {0, 0, 7, 7, 40, 100};
constexpr int64_t kRows = 130;

// Rows [offsets[E], T) of y must be exactly as before the call.
::testing::AssertionResult tail_untouched(const Tensor& y, const Tensor& before, int64_t from) {
  const auto a = test::to_doubles(y.slice(from, y.dim(0)));
  const auto b = test::to_doubles(before.slice(from, before.dim(0)));
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i];
    if (!same) return ::testing::AssertionFailure() << "row past offsets[E] written at " << i;
  }
  return ::testing::AssertionSuccess();
}

TEST(GroupedMatmul, MatchesReferenceWithEmptyGroupsAndUnusedTail) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t groups = static_cast<int64_t>(kOffsets.size()) - 1, used = kOffsets.back();
  for (auto [n, k] : {std::pair<int64_t, int64_t>{33, 7}, {7, 130}, {130, 33}, {1, 1}}) {
    for (bool trans_w : {false, true}) {
      for (DType in : {DType::f32, DType::bf16}) {
        Tensor x = random_tensor({kRows, k}, in, "x");
        Tensor w = random_tensor(trans_w ? Shape{groups, n, k} : Shape{groups, k, n}, in, "w");
        for (DType out : {DType::f32, DType::bf16}) {
          for (float beta : {0.0f, 0.5f}) {
            Tensor y =
                beta == 0.0f ? poisoned({kRows, n}, out) : random_tensor({kRows, n}, out, "y");
            Tensor before = y.clone(), expect = y.clone();
            grouped_matmul(cpu, x, w, kOffsets, y, trans_w, beta);
            grouped_matmul(ref, x, w, kOffsets, expect, trans_w, beta);
            EXPECT_TRUE(close(y.slice(0, used), expect.slice(0, used)))
                << "n " << n << " k " << k << " trans_w " << trans_w << " " << dtype_name(in)
                << " -> " << dtype_name(out) << " beta " << beta;
            EXPECT_TRUE(tail_untouched(y, before, used));
          }
        }
      }
    }
  }
}

TEST(GroupedMatmul, ManyDistinctGroupSizesShareOneRunTimePrimitive) {
  // Group sizes move every step: they share one run-time-dimension primitive
  // per family, so the cache stays bounded and a result depends on the shape
  // alone, not on which sizes came before (bit-exact resume needs this).
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t n = 7, k = 5, t = 150;
  Tensor x = random_tensor({t, k}, DType::f32, "x"), w = random_tensor({1, n, k}, DType::f32, "w");
  Tensor dy = random_tensor({t, n}, DType::f32, "dy");
  for (int64_t rows = 1; rows <= t; ++rows) {
    const std::vector<int64_t> off = {0, rows};
    Tensor y = poisoned({t, n}, DType::f32), expect = poisoned({t, n}, DType::f32);
    grouped_matmul(cpu, x, w, off, y, true, 0.0f);
    grouped_matmul(ref, x, w, off, expect, true, 0.0f);
    ASSERT_TRUE(close(y.slice(0, rows), expect.slice(0, rows))) << "rows " << rows;
    Tensor dw = poisoned({1, n, k}, DType::f32), dw_ref = poisoned({1, n, k}, DType::f32);
    grouped_matmul_weight_grad(cpu, dy, x, off, dw, 0.0f);
    grouped_matmul_weight_grad(ref, dy, x, off, dw_ref, 0.0f);
    ASSERT_TRUE(close(dw, dw_ref)) << "weight grad rows " << rows;
  }
  EXPECT_EQ(cpu.cpu_state().keyed_primitives.size(), 2u);  // forward, weight grad
  // The same call in a fresh context (no history) gives the same bits.
  Context fresh(Backend::cpu);
  const std::vector<int64_t> off = {0, 77};
  Tensor a = poisoned({t, n}, DType::f32), b = poisoned({t, n}, DType::f32);
  grouped_matmul(cpu, x, w, off, a, true, 0.0f);
  grouped_matmul(fresh, x, w, off, b, true, 0.0f);
  EXPECT_TRUE(test::all_close(a.slice(0, 77), b.slice(0, 77), {0, 0}));
}

TEST(GroupedMatmulWeightGrad, MatchesReferenceAndEmptyGroupsGiveBetaTimesDw) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t groups = static_cast<int64_t>(kOffsets.size()) - 1;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{33, 7}, {7, 130}, {130, 33}, {1, 1}}) {
    for (DType in : {DType::f32, DType::bf16}) {
      Tensor dy = random_tensor({kRows, n}, in, "dy"), x = random_tensor({kRows, k}, in, "x");
      // bf16 dw (train.grad_dtype = bf16): fp32 sums, one rounding into dw.
      for (DType out : {DType::f32, DType::bf16}) {
        for (float beta : {0.0f, 1.0f, -0.5f}) {
          // beta == 0: every dw[e] is written, empty groups with zeros.
          Tensor dw = beta == 0.0f ? poisoned({groups, n, k}, out)
                                   : random_tensor({groups, n, k}, out, "dw");
          Tensor expect = dw.clone();
          grouped_matmul_weight_grad(cpu, dy, x, kOffsets, dw, beta);
          grouped_matmul_weight_grad(ref, dy, x, kOffsets, expect, beta);
          EXPECT_TRUE(close(dw, expect)) << "n " << n << " k " << k << " " << dtype_name(in)
                                         << " -> " << dtype_name(out) << " beta " << beta;
        }
      }
    }
  }
}

// y = x w^T with loss = sum(y * g): dL/dx = g w and dL/dw = g^T x. Both
// gradients are computed with matmul variants (no transpose, trans_a) and
// checked by finite differences through the reference forward: this pins the
// meaning of every transpose flag that models rely on.
TEST(MatmulReference, LinearLayerGradientIdentitiesMatchFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t m = 7, n = 5, k = 6;
  Tensor x = random_tensor({m, k}, DType::f64, "x"), w = random_tensor({n, k}, DType::f64, "w");
  Tensor g = random_tensor({m, n}, DType::f64, "g");
  Tensor y = Tensor::zeros({m, n}, DType::f64);
  auto loss = [&] {
    MatmulArgs fwd;
    fwd.trans_b = true;
    matmul(ref, x, w, y, fwd);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.data<double>()[i] * g.data<double>()[i];
    return s;
  };
  Tensor dx = poisoned({m, k}, DType::f64), dw = poisoned({n, k}, DType::f64);
  matmul(ref, g, w, dx, {});  // [m, n] x [n, k]
  MatmulArgs ta;
  ta.trans_a = true;
  matmul(ref, g, x, dw, ta);  // [m, n]^T x [m, k]
  EXPECT_TRUE(test::finite_difference_check(loss, x, dx));
  EXPECT_TRUE(test::finite_difference_check(loss, w, dw));
}

// The same identities for the grouped (expert) GEMMs: y_e = x_e w_e^T gives
// dx_e = dy_e w_e (grouped_matmul without trans_w) and dw_e = dy_e^T x_e.
TEST(GroupedMatmulReference, ExpertGradientIdentitiesMatchFiniteDifferences) {
  Context ref(Backend::reference);
  const std::vector<int64_t> off = {0, 3, 3, 8};  // middle expert empty; rows 8, 9 unused
  const int64_t t = 10, n = 4, k = 5, groups = 3;
  Tensor x = random_tensor({t, k}, DType::f64, "x"),
         w = random_tensor({groups, n, k}, DType::f64, "w");
  Tensor g = random_tensor({t, n}, DType::f64, "g");
  Tensor y = Tensor::zeros({t, n}, DType::f64);
  auto loss = [&] {
    grouped_matmul(ref, x, w, off, y, true, 0.0f);
    double s = 0;
    for (int64_t i = 0; i < off.back() * n; ++i) s += y.data<double>()[i] * g.data<double>()[i];
    return s;
  };
  Tensor dx = Tensor::zeros({t, k}, DType::f64), dw = poisoned({groups, n, k}, DType::f64);
  grouped_matmul(ref, g, w, off, dx, false, 0.0f);  // w_e [n, k] read as [K_in = n, N_out = k]
  grouped_matmul_weight_grad(ref, g, x, off, dw, 0.0f);
  EXPECT_TRUE(test::finite_difference_check(loss, x, dx));
  EXPECT_TRUE(test::finite_difference_check(loss, w, dw));
}

TEST(Matmul, BadShapesAndDtypesAreErrors) {
  for (Backend be : {Backend::cpu, Backend::reference}) {
    SCOPED_TRACE(be == Backend::cpu ? "cpu" : "reference");
    Context ctx(be);
    const Tensor a = Tensor::zeros({4, 3}, DType::f32), b = Tensor::zeros({3, 5}, DType::f32);
    const Tensor c = Tensor::zeros({4, 5}, DType::f32);
    EXPECT_NO_THROW(matmul(ctx, a, b, c, {}));
    EXPECT_THROW(matmul(ctx, a, Tensor::zeros({4, 5}, DType::f32), c, {}), Error);   // K differs
    EXPECT_THROW(matmul(ctx, a, b, Tensor::zeros({4, 6}, DType::f32), {}), Error);   // c shape
    EXPECT_THROW(matmul(ctx, a, Tensor::zeros({3, 5}, DType::bf16), c, {}), Error);  // a, b dtypes
    EXPECT_THROW(matmul(ctx, Tensor::zeros({3}, DType::f32), b, c, {}), Error);      // rank 1
    EXPECT_THROW(
        matmul(ctx, Tensor::zeros({2, 4, 3}, DType::f32), Tensor::zeros({3, 3, 5}, DType::f32),
               Tensor::zeros({2, 4, 5}, DType::f32), {}),
        Error);  // batch dims differ
    EXPECT_THROW(
        matmul(ctx, Tensor::zeros({4, 3}, DType::i32), Tensor::zeros({3, 5}, DType::i32), c, {}),
        Error);
    MatmulArgs tb;
    tb.trans_b = true;
    EXPECT_THROW(matmul(ctx, a, b, c, tb), Error);  // b read as [5, 3]^T: K = 5

    const Tensor x = Tensor::zeros({10, 3}, DType::f32), w = Tensor::zeros({2, 5, 3}, DType::f32);
    const Tensor y = Tensor::zeros({10, 5}, DType::f32);
    const std::vector<int64_t> ok = {0, 4, 9};
    EXPECT_NO_THROW(grouped_matmul(ctx, x, w, ok, y, true, 0.0f));
    EXPECT_THROW(grouped_matmul(ctx, x, w, std::vector<int64_t>{0, 9}, y, true, 0.0f), Error);
    EXPECT_THROW(grouped_matmul(ctx, x, w, std::vector<int64_t>{0, 5, 4}, y, true, 0.0f), Error);
    EXPECT_THROW(grouped_matmul(ctx, x, w, std::vector<int64_t>{0, 4, 11}, y, true, 0.0f), Error);
    EXPECT_THROW(grouped_matmul(ctx, x, w, std::vector<int64_t>{1, 4, 9}, y, true, 0.0f), Error);
    EXPECT_THROW(grouped_matmul(ctx, x, w, ok, y, false, 0.0f), Error);  // w read as [3, 5]: K = 5
    EXPECT_THROW(grouped_matmul(ctx, x, w, ok, Tensor::zeros({10, 4}, DType::f32), true, 0.0f),
                 Error);

    const Tensor dw = Tensor::zeros({2, 5, 3}, DType::f32);
    EXPECT_NO_THROW(grouped_matmul_weight_grad(ctx, y, x, ok, dw, 0.0f));
    EXPECT_THROW(
        grouped_matmul_weight_grad(ctx, Tensor::zeros({9, 5}, DType::f32), x, ok, dw, 0.0f),
        Error);  // rows differ
    EXPECT_THROW(
        grouped_matmul_weight_grad(ctx, y, x, ok, Tensor::zeros({2, 5, 4}, DType::f32), 0.0f),
        Error);
    EXPECT_NO_THROW(
        grouped_matmul_weight_grad(ctx, y, x, ok, Tensor::zeros({2, 5, 3}, DType::bf16), 0.0f));
    EXPECT_THROW(
        grouped_matmul_weight_grad(ctx, y, x, ok, Tensor::zeros({2, 5, 3}, DType::i32), 0.0f),
        Error);  // dw must be a float (f16 is staged through f32 on the CPU)
  }
}

}  // namespace
}  // namespace moetron::kernels
