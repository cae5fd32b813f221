// Cross-entropy on logits and fused with the LM head: CPU (and plain
// cross-entropy on CUDA) against the fp64 reference, the reference gradients
// against finite differences, ignored targets, chunking, skipped gradients,
// and bad input.
#include "moetron/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "moetron/core/rng.h"
#include "moetron/kernels/cpu/simd.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// f32 losses: log-sum-exp of O(1..10) values with a ~1 ulp exp, a few roundings.
constexpr test::Tolerance kLossTol{1e-5, 1e-5};
// f32 gradients: relative error per element ~1e-6; normalised by the largest
// entry (the target's p - 1) so near-zero probabilities do not dominate.
constexpr double kF32GradTol = 1e-5;
// bf16 gradients: each dlogit is rounded to bf16 (2^-9 relative) before it is
// stored, or before the fused d_hidden GEMM (whose result is rounded again).
constexpr double kBf16GradTol = 1.5e-2;
// The fused d_head_w is computed from fp32 dlogits and the bf16 hidden values
// widened exactly to f32, for either input dtype: fp32 accuracy.
constexpr double kHeadGradTol = 1e-5;

std::string tag(DType dt, int64_t T, int64_t V, int64_t D = -1, int64_t chunk = -1) {
  std::string s =
      std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " V=" + std::to_string(V);
  if (D >= 0) s += " D=" + std::to_string(D);
  if (chunk >= 0) s += " chunk=" + std::to_string(chunk);
  return s;
}

// Random targets in [0, V), every fifth one ignored (-1 or -100).
Tensor make_targets(int64_t T, int64_t V, const std::string& name) {
  Tensor t = Tensor::empty({T}, DType::i32, MemTag::workspace);
  PhiloxStream rng(3, name);
  for (int64_t i = 0; i < T; ++i) {
    const int32_t v = static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(V));
    t.data<int32_t>()[i] = i % 5 == 3 ? (i % 2 ? -1 : -100) : v;
  }
  return t;
}

void expect_ignored_rows_zero(const Tensor& targets, const Tensor& losses, const Tensor& grad,
                              const std::string& what) {
  const int64_t T = targets.dim(0), V = grad.defined() ? grad.dim(1) : 0;
  for (int64_t t = 0; t < T; ++t) {
    if (targets.data<int32_t>()[t] >= 0) continue;
    EXPECT_EQ(test::element(losses, t), 0.0) << what << " token " << t;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_EQ(test::element(grad, t * V + v), 0.0) << what << " token " << t;
    }
  }
}

TEST(CrossEntropy, CpuMatchesReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t T : test::kAwkwardSizes) {
      for (int64_t V : {7, 33, 130, 1000}) {
        const std::string what = tag(dt, T, V);
        Tensor logits = random_tensor({T, V}, dt, "logits" + what, -4, 4);
        Tensor targets = make_targets(T, V, what);
        const float scale = 1.0f / static_cast<float>(T);
        Tensor loss = poisoned({T}, DType::f32), loss_ref = poisoned({T}, DType::f32);
        Tensor dl = poisoned({T, V}, dt), dl_ref = poisoned({T, V}, dt);
        cross_entropy(cpu, logits, targets, scale, loss, dl);
        cross_entropy(ref, logits, targets, scale, loss_ref, dl_ref);
        EXPECT_TRUE(test::all_close(loss, loss_ref, kLossTol)) << what;
        EXPECT_TRUE(
            test::normalized_close(dl, dl_ref, dt == DType::f32 ? kF32GradTol : kBf16GradTol))
            << what;
        expect_ignored_rows_zero(targets, loss, dl, what);

        // Losses alone, and in place (dlogits aliasing logits), give the same numbers.
        Tensor loss_only = poisoned({T}, DType::f32);
        cross_entropy(cpu, logits, targets, scale, loss_only, Tensor());
        EXPECT_TRUE(test::all_close(loss_only, loss, {0, 0})) << what;
        for (Context* ctx : {&cpu, &ref}) {
          Tensor inplace = logits.clone();
          Tensor loss_in = poisoned({T}, DType::f32);
          cross_entropy(*ctx, inplace, targets, scale, loss_in, inplace);
          const Tensor& expect = ctx == &cpu ? dl : dl_ref;
          EXPECT_TRUE(test::all_close(inplace, expect, {0, 0})) << what << " in place";
        }
      }
    }
  }
}

// Also a vocabulary of 32000 (many elements per thread) and T = 1000 rows.
TEST(CrossEntropy, CudaMatchesReference) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda), ref(Backend::reference);
  const auto dev = [&](const Tensor& t) { return test::on_device(gpu, t); };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t T : {int64_t{1}, int64_t{7}, int64_t{130}, int64_t{1000}}) {
      for (int64_t V : {int64_t{7}, int64_t{33}, int64_t{1000}, int64_t{32000}}) {
        const std::string what = tag(dt, T, V);
        Tensor logits = random_tensor({T, V}, dt, "logits" + what, -4, 4);
        Tensor targets = make_targets(T, V, what);
        const float scale = 1.0f / static_cast<float>(T);
        Tensor loss = dev(poisoned({T}, DType::f32)), loss_ref = poisoned({T}, DType::f32);
        Tensor dl = dev(poisoned({T, V}, dt)), dl_ref = poisoned({T, V}, dt);
        cross_entropy(gpu, dev(logits), dev(targets), scale, loss, dl);
        cross_entropy(ref, logits, targets, scale, loss_ref, dl_ref);
        const Tensor loss_h = test::on_host(loss), dl_h = test::on_host(dl);
        EXPECT_TRUE(test::all_close(loss_h, loss_ref, kLossTol)) << what;
        EXPECT_TRUE(
            test::normalized_close(dl_h, dl_ref, dt == DType::f32 ? kF32GradTol : kBf16GradTol))
            << what;
        expect_ignored_rows_zero(targets, loss_h, dl_h, what);

        // Losses alone, and in place (dlogits aliasing logits), give the same numbers.
        Tensor loss_only = dev(poisoned({T}, DType::f32));
        cross_entropy(gpu, dev(logits), dev(targets), scale, loss_only, Tensor());
        EXPECT_TRUE(test::all_close(test::on_host(loss_only), loss_h, {0, 0})) << what;
        Tensor inplace = dev(logits), loss_in = dev(poisoned({T}, DType::f32));
        cross_entropy(gpu, inplace, dev(targets), scale, loss_in, inplace);
        EXPECT_TRUE(test::all_close(test::on_host(inplace), dl_h, {0, 0})) << what << " in place";
      }
    }
  }
}

TEST(CrossEntropy, CudaBadTargetIsAnErrorAndWritesNothing) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  const int64_t T = 130, V = 33;
  Tensor logits = test::on_device(gpu, random_tensor({T, V}, DType::f32, "l"));
  Tensor big = make_targets(T, V, "bad");
  big.data<int32_t>()[77] = static_cast<int32_t>(V);
  big.data<int32_t>()[100] = static_cast<int32_t>(V + 5);
  Tensor losses = test::on_device(gpu, Tensor::zeros({T}, DType::f32));
  try {
    cross_entropy(gpu, logits, test::on_device(gpu, big), 1.0f, losses, Tensor());
    ADD_FAILURE() << "a target >= V was accepted";
  } catch (const Error& e) {
    // The first bad target is named, as on the CPU.
    EXPECT_NE(std::string(e.what()).find("targets[77] = 33"), std::string::npos) << e.what();
  }
  const Tensor host = test::on_host(losses);
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(host.data<float>()[t], 0.0f);
  // Host targets on a CUDA context are refused (the kernel would read host memory).
  EXPECT_THROW(cross_entropy(gpu, logits, make_targets(T, V, "host"), 1.0f, losses, Tensor()),
               Error);
}

TEST(CrossEntropy, ReferenceGradientMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 6, V = 9;
  const float scale = 0.37f;
  Tensor logits = test::to_dtype(random_tensor({T, V}, DType::f32, "fd", -3, 3), DType::f64);
  Tensor targets = make_targets(T, V, "fd");
  Tensor losses = poisoned({T}, DType::f64);
  auto loss = [&] {
    cross_entropy(ref, logits, targets, scale, losses, Tensor());
    double s = 0;
    for (int64_t t = 0; t < T; ++t) s += scale * losses.data<double>()[t];
    return s;
  };
  Tensor dl = poisoned({T, V}, DType::f64);
  cross_entropy(ref, logits, targets, scale, losses, dl);
  EXPECT_TRUE(test::finite_difference_check(loss, logits, dl, 1e-6, 1e-7));
}

struct FusedOut {
  Tensor losses, d_hidden, d_head_w;
};

// d_head_w starts from a fixed random value: the kernel accumulates into it.
FusedOut run_fused(Context& ctx, const Tensor& h, const Tensor& w, const Tensor& targets,
                   float scale, int64_t chunk, bool want_dh = true, bool want_dw = true) {
  const int64_t T = h.dim(0), D = h.dim(1), V = w.dim(0);
  const DType acc = ctx.backend() == Backend::reference ? DType::f64 : DType::f32;
  FusedOut o{poisoned({T}, DType::f32), want_dh ? poisoned({T, D}, h.dtype()) : Tensor(),
             want_dw ? test::to_dtype(random_tensor({V, D}, DType::f32, "dw0"), acc) : Tensor()};
  cross_entropy_fused(ctx, h, w, targets, scale, chunk, o.losses, o.d_hidden, o.d_head_w);
  return o;
}

TEST(CrossEntropyFused, CpuMatchesReferenceForEveryChunking) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  struct Size {
    int64_t T, V, D;
  };
  std::vector<Size> sizes;
  for (int64_t T : test::kAwkwardSizes) {
    for (int64_t V : {7, 33, 130, 1000}) sizes.push_back({T, V, 17});
  }
  for (int64_t D : {1, 33, 64}) sizes.push_back({33, 130, D});
  for (DType dt : {DType::f32, DType::bf16}) {
    const double grad_tol = dt == DType::f32 ? kF32GradTol : kBf16GradTol;
    for (const Size& s : sizes) {
      const std::string base = tag(dt, s.T, s.V, s.D);
      Tensor h = random_tensor({s.T, s.D}, dt, "h" + base, -1, 1);
      Tensor w = random_tensor({s.V, s.D}, dt, "w" + base, -1, 1);
      Tensor targets = make_targets(s.T, s.V, base);
      const float scale = 1.0f / static_cast<float>(s.T);
      const FusedOut expect = run_fused(ref, h, w, targets, scale, 1);
      // Smaller than T and not dividing it (4 into 7, 33, 130), dividing it
      // (10 into 130), equal to T, and larger than T.
      for (int64_t chunk : {int64_t{4}, int64_t{10}, s.T, s.T + 3}) {
        const std::string what = tag(dt, s.T, s.V, s.D, chunk);
        const FusedOut got = run_fused(cpu, h, w, targets, scale, chunk);
        EXPECT_TRUE(test::all_close(got.losses, expect.losses, kLossTol)) << what;
        EXPECT_TRUE(test::normalized_close(got.d_hidden, expect.d_hidden, grad_tol)) << what;
        EXPECT_TRUE(test::normalized_close(got.d_head_w, expect.d_head_w, kHeadGradTol)) << what;
        for (int64_t t = 0; t < s.T; ++t) {
          if (targets.data<int32_t>()[t] >= 0) continue;
          EXPECT_EQ(got.losses.data<float>()[t], 0.0f) << what;
          for (int64_t d = 0; d < s.D; ++d)
            ASSERT_EQ(test::element(got.d_hidden, t * s.D + d), 0.0);
        }
      }
    }
  }
}

TEST(CrossEntropyFused, MatchesPlainCrossEntropyOnTheLogits) {
  Context cpu(Backend::cpu);
  const int64_t T = 33, V = 130, D = 17;
  Tensor h = random_tensor({T, D}, DType::f32, "h"), w = random_tensor({V, D}, DType::f32, "w");
  Tensor targets = make_targets(T, V, "plain");
  Tensor logits = Tensor::empty({T, V}, DType::f32);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t v = 0; v < V; ++v) {
      float acc = 0;
      for (int64_t d = 0; d < D; ++d)
        acc += h.data<float>()[t * D + d] * w.data<float>()[v * D + d];
      logits.data<float>()[t * V + v] = acc;
    }
  }
  Tensor loss = poisoned({T}, DType::f32);
  cross_entropy(cpu, logits, targets, 1.0f, loss, Tensor());
  const FusedOut fused = run_fused(cpu, h, w, targets, 1.0f, 8, false, false);
  EXPECT_TRUE(test::all_close(fused.losses, loss, kLossTol));
}

TEST(CrossEntropyFused, UndefinedGradientsAreSkipped) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t T = 33, V = 130, D = 17;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor h = random_tensor({T, D}, dt, "h"), w = random_tensor({V, D}, dt, "w");
    Tensor targets = make_targets(T, V, "skip");
    for (Context* ctx : {&cpu, &ref}) {
      const FusedOut all = run_fused(*ctx, h, w, targets, 0.1f, 8);
      const FusedOut none = run_fused(*ctx, h, w, targets, 0.1f, 8, false, false);
      const FusedOut dh_only = run_fused(*ctx, h, w, targets, 0.1f, 8, true, false);
      const FusedOut dw_only = run_fused(*ctx, h, w, targets, 0.1f, 8, false, true);
      EXPECT_TRUE(test::all_close(none.losses, all.losses, {0, 0}));
      EXPECT_TRUE(test::all_close(dh_only.d_hidden, all.d_hidden, {0, 0}));
      EXPECT_TRUE(test::all_close(dw_only.d_head_w, all.d_head_w, {0, 0}));
    }
  }
}

TEST(CrossEntropyFused, ReferenceGradientsMatchFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 5, V = 7, D = 4;
  const float scale = 0.37f;
  auto f64 = [](const Tensor& t) { return test::to_dtype(t, DType::f64); };
  Tensor h = f64(random_tensor({T, D}, DType::f32, "h", -1, 1));
  Tensor w = f64(random_tensor({V, D}, DType::f32, "w", -1, 1));
  Tensor targets = make_targets(T, V, "fdf");
  Tensor losses = poisoned({T}, DType::f64);
  auto loss = [&] {
    cross_entropy_fused(ref, h, w, targets, scale, 2, losses, Tensor(), Tensor());
    double s = 0;
    for (int64_t t = 0; t < T; ++t) s += scale * losses.data<double>()[t];
    return s;
  };
  Tensor dh = poisoned({T, D}, DType::f64), dw = Tensor::zeros({V, D}, DType::f64);
  cross_entropy_fused(ref, h, w, targets, scale, 2, losses, dh, dw);
  EXPECT_TRUE(test::finite_difference_check(loss, h, dh, 1e-6, 1e-7));
  EXPECT_TRUE(test::finite_difference_check(loss, w, dw, 1e-6, 1e-7));
}

TEST(CrossEntropy, ResultsDoNotDependOnTheThreadCount) {
  const int64_t T = 130, V = 1000, D = 64;
  Tensor logits = random_tensor({T, V}, DType::bf16, "logits", -4, 4);
  Tensor h = random_tensor({T, D}, DType::bf16, "h"), w = random_tensor({V, D}, DType::bf16, "w");
  Tensor targets = make_targets(T, V, "threads");
  std::vector<std::vector<double>> results[2];
  for (int threads : {1, 2}) {
    Context cpu(Backend::cpu, threads);
    Tensor loss = poisoned({T}, DType::f32), dl = poisoned({T, V}, DType::bf16);
    cross_entropy(cpu, logits, targets, 0.01f, loss, dl);
    const FusedOut f = run_fused(cpu, h, w, targets, 0.01f, 48);
    for (const Tensor* t : {&f.losses, &f.d_hidden, &f.d_head_w, static_cast<const Tensor*>(&loss),
                            static_cast<const Tensor*>(&dl)}) {
      results[threads - 1].push_back(test::to_doubles(*t));
    }
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    if (i == 2 && !MOETRON_SIMD_AVX512) {
      // d_head_w accumulates chunk by chunk in an fp32 oneDNN matmul, whose
      // AVX2 sgemm kernels ("gemm:jit") sum in an order that depends on the
      // thread split; the AVX-512 brgemm kernels do not. Same values to fp32
      // rounding here, same bits there.
      double diff = 0, norm = 0;
      for (size_t j = 0; j < results[0][i].size(); ++j) {
        diff += std::pow(results[0][i][j] - results[1][i][j], 2);
        norm += std::pow(results[0][i][j], 2);
      }
      EXPECT_LT(std::sqrt(diff / norm), 1e-6) << "result " << i;
      continue;
    }
    EXPECT_EQ(results[0][i], results[1][i]) << "result " << i;
  }
}

TEST(CrossEntropy, BadInputIsAnError) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t T = 7, V = 9, D = 5;
  Tensor logits = random_tensor({T, V}, DType::f32, "l");
  Tensor targets = make_targets(T, V, "bad");
  Tensor losses = Tensor::zeros({T}, DType::f32);
  Tensor h = random_tensor({T, D}, DType::f32, "h"), w = random_tensor({V, D}, DType::f32, "w");
  Tensor dh = Tensor::zeros({T, D}, DType::f32), dw = Tensor::zeros({V, D}, DType::f32);
  Tensor big = targets.clone();
  big.data<int32_t>()[2] = static_cast<int32_t>(V);
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(cross_entropy(*ctx, logits, big, 1.0f, losses, Tensor()), Error);
    EXPECT_THROW(
        cross_entropy(*ctx, logits, Tensor::zeros({T + 1}, DType::i32), 1.0f, losses, Tensor()),
        Error);
    EXPECT_THROW(
        cross_entropy(*ctx, logits, Tensor::zeros({T}, DType::i64), 1.0f, losses, Tensor()), Error);
    EXPECT_THROW(
        cross_entropy(*ctx, logits, targets, 1.0f, Tensor::zeros({T - 1}, DType::f32), Tensor()),
        Error);
    EXPECT_THROW(
        cross_entropy(*ctx, logits, targets, 1.0f, losses, Tensor::zeros({T, V + 1}, DType::f32)),
        Error);
    EXPECT_THROW(
        cross_entropy(*ctx, logits, targets, 1.0f, losses, Tensor::zeros({T, V}, DType::bf16)),
        Error);
    EXPECT_THROW(cross_entropy_fused(*ctx, h, w, big, 1.0f, 4, losses, dh, dw), Error);
    EXPECT_THROW(cross_entropy_fused(*ctx, h, w, targets, 1.0f, 0, losses, dh, dw), Error);
    EXPECT_THROW(cross_entropy_fused(*ctx, h, test::to_dtype(w, DType::bf16), targets, 1.0f, 4,
                                     losses, dh, dw),
                 Error);
    EXPECT_THROW(cross_entropy_fused(*ctx, h, Tensor::zeros({V, D + 1}, DType::f32), targets, 1.0f,
                                     4, losses, dh, dw),
                 Error);
    EXPECT_THROW(cross_entropy_fused(*ctx, h, w, targets, 1.0f, 4, losses,
                                     Tensor::zeros({T, D}, DType::bf16), dw),
                 Error);
    EXPECT_THROW(cross_entropy_fused(*ctx, h, w, targets, 1.0f, 4, losses, dh,
                                     Tensor::zeros({V + 1, D}, DType::f32)),
                 Error);
  }
  // The CPU backend keeps d_head_w in f32 and does not take f64 inputs.
  EXPECT_THROW(cross_entropy_fused(cpu, h, w, targets, 1.0f, 4, losses, dh,
                                   Tensor::zeros({V, D}, DType::bf16)),
               Error);
  EXPECT_THROW(
      cross_entropy(cpu, test::to_dtype(logits, DType::f64), targets, 1.0f, losses, Tensor()),
      Error);
  // Nothing was written by the rejected calls.
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(losses.data<float>()[t], 0.0f);
}

}  // namespace
}  // namespace moetron::kernels
