// Vocabulary-parallel cross-entropy steps: each CPU step against the fp64
// reference on the same inputs (targets inside, below and above the slice,
// ignored ones), thread-count determinism, and the composition the
// all-reduces make: three slices of the vocabulary, their maxima combined
// by max and their sums by sum, give kernels::cross_entropy's losses and
// gradient over the whole vocabulary.
#include "moetron/kernels/vocab_parallel_ce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/cross_entropy.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// A max of f32 values is one of them: exact.
constexpr test::Tolerance kExact{0, 0};
// exp of an f32 argument |l - m| <= 8, rounded once more than the
// reference's: argument rounding 8 * 2^-24 plus ~1 ulp of exp.
constexpr test::Tolerance kExpTol{2e-6, 0};
// A running f32 sum of V <= 257 of those exps, each in (0, 1]: the
// worst-case bound V * 2^-24 = 1.5e-5 relative, plus the exps' own error.
constexpr test::Tolerance kSumTol{2e-5, 1e-7};
// Loss from the same stats: one f32 log and one subtraction, |loss| < 20.
constexpr test::Tolerance kLossStepTol{1e-6, 1e-6};
// Gradient from the same exps and stats: a division and two products per
// element; normalised by the largest entry (the target's p - 1).
constexpr double kGradStepTol = 1e-6;
// Whole pipeline in f32 against the full-vocabulary fp64 cross-entropy:
// the budgets of tests/kernels/cross_entropy_test.cpp for the CPU kernel.
constexpr test::Tolerance kLossTol{1e-5, 1e-5};
constexpr double kGradTol = 1e-5;
// The same composition in f64 on the reference: only reassociation of the
// sum over slices and the division by the sum apart.
constexpr test::Tolerance kF64Tol{1e-12, 1e-13};

std::string tag(int64_t C, int64_t V, int64_t offset) {
  return "C=" + std::to_string(C) + " V=" + std::to_string(V) + " offset=" + std::to_string(offset);
}

// Targets in [0, vocab), every fourth one ignored (-1).
Tensor make_targets(int64_t C, int64_t vocab, const std::string& name) {
  Tensor t = Tensor::empty({C}, DType::i32, MemTag::workspace);
  PhiloxStream rng(7, name);
  for (int64_t i = 0; i < C; ++i) {
    const auto v = static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(vocab));
    t.data<int32_t>()[i] = i % 4 == 1 ? -1 : v;
  }
  return t;
}

Tensor copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), MemTag::workspace);
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

// The global row maxima the all-reduce would bring: the slice's own raised
// by up to 2 on some rows, as when another rank holds a larger logit.
Tensor global_max(const Tensor& logits, const std::string& name) {
  Context ref(Backend::reference);
  Tensor mx = poisoned({logits.dim(0)}, logits.dtype());
  vocab_parallel_ce_max(ref, logits, mx);
  Tensor raise = random_tensor({logits.dim(0)}, DType::f32, "raise " + name, 0, 2);
  for (int64_t i = 0; i < logits.dim(0); ++i) {
    if (i % 3 == 2) mx.data<float>()[i] += raise.data<float>()[i];
  }
  return mx;
}

struct Slice {
  int64_t C, V, offset;
};

// Slices of a 3 * V vocabulary at offsets 0, 5 (not a multiple of V) and
// 2 V: targets fall below, inside and above the slice.
std::vector<Slice> slices() {
  std::vector<Slice> out;
  for (int64_t C : {1, 7, 33}) {
    for (int64_t V : {1, 13, 257}) {
      for (int64_t offset : {int64_t{0}, int64_t{5}, 2 * V}) out.push_back({C, V, offset});
    }
  }
  return out;
}

TEST(VocabParallelCe, CpuStepsMatchReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (const Slice& s : slices()) {
    const std::string what = tag(s.C, s.V, s.offset);
    const Tensor logits = random_tensor({s.C, s.V}, DType::f32, "logits " + what, -4, 4);
    const Tensor targets = make_targets(s.C, 3 * s.V, what);

    Tensor mx = poisoned({s.C}, DType::f32), mx_ref = poisoned({s.C}, DType::f32);
    vocab_parallel_ce_max(cpu, logits, mx);
    vocab_parallel_ce_max(ref, logits, mx_ref);
    EXPECT_TRUE(test::all_close(mx, mx_ref, kExact)) << what;

    const Tensor gmax = global_max(logits, what);
    Tensor ex = copy(logits), ex_ref = copy(logits);
    Tensor st = poisoned({s.C, 2}, DType::f32), st_ref = poisoned({s.C, 2}, DType::f32);
    vocab_parallel_ce_exp_sum(cpu, ex, gmax, targets, s.offset, st);
    vocab_parallel_ce_exp_sum(ref, ex_ref, gmax, targets, s.offset, st_ref);
    EXPECT_TRUE(test::all_close(ex, ex_ref, kExpTol)) << what;
    EXPECT_TRUE(test::all_close(st, st_ref, kSumTol)) << what;

    Tensor loss = poisoned({s.C}, DType::f32), loss_ref = poisoned({s.C}, DType::f32);
    vocab_parallel_ce_loss(cpu, st_ref, targets, loss);
    vocab_parallel_ce_loss(ref, st_ref, targets, loss_ref);
    EXPECT_TRUE(test::all_close(loss, loss_ref, kLossStepTol)) << what;

    const float scale = 1.0f / static_cast<float>(s.C);
    Tensor g = copy(ex_ref), g_ref = copy(ex_ref);
    vocab_parallel_ce_grad(cpu, g, st_ref, targets, s.offset, scale);
    vocab_parallel_ce_grad(ref, g_ref, st_ref, targets, s.offset, scale);
    EXPECT_TRUE(test::normalized_close(g, g_ref, kGradStepTol)) << what;
  }
}

// The target's shifted logit lands in stats[i, 1] exactly when the target
// is this slice's, every other entry 0; an ignored row's loss and gradient 0.
TEST(VocabParallelCe, TargetColumnAndIgnoredRows) {
  for (Backend b : {Backend::cpu, Backend::reference}) {
    Context ctx(b);
    const int64_t C = 6, V = 4, offset = 4;
    const Tensor logits = random_tensor({C, V}, DType::f32, "ignored", -4, 4);
    Tensor targets = Tensor::empty({C}, DType::i32, MemTag::workspace);
    const int32_t tg[C] = {3, 4, 7, 8, -1, 5};  // below, first, last, above, ignored, inside
    std::copy(tg, tg + C, targets.data<int32_t>());
    Tensor mx = poisoned({C}, DType::f32), st = poisoned({C, 2}, DType::f32);
    Tensor ex = copy(logits);
    vocab_parallel_ce_max(ctx, logits, mx);
    vocab_parallel_ce_exp_sum(ctx, ex, mx, targets, offset, st);
    for (int64_t i = 0; i < C; ++i) {
      const int64_t local = tg[i] - offset;
      const float expected = tg[i] >= 0 && local >= 0 && local < V
                                 ? logits.data<float>()[i * V + local] - mx.data<float>()[i]
                                 : 0.0f;
      EXPECT_EQ(st.data<float>()[2 * i + 1], expected) << backend_name(b) << " row " << i;
    }
    Tensor loss = poisoned({C}, DType::f32);
    vocab_parallel_ce_loss(ctx, st, targets, loss);
    vocab_parallel_ce_grad(ctx, ex, st, targets, offset, 0.5f);
    EXPECT_EQ(loss.data<float>()[4], 0.0f) << backend_name(b);
    for (int64_t j = 0; j < V; ++j) EXPECT_EQ(ex.data<float>()[4 * V + j], 0.0f) << backend_name(b);
  }
}

// One row per thread in a fixed order: the bits do not depend on the team.
TEST(VocabParallelCe, CpuResultsIndependentOfThreadCount) {
  const int64_t C = 33, V = 1000;  // above the parallel threshold
  const Tensor logits = random_tensor({C, V}, DType::f32, "threads", -4, 4);
  const Tensor targets = make_targets(C, 2 * V, "threads");
  std::vector<Tensor> grads, stats;
  for (int threads : {1, 2, 3}) {
    Context ctx(Backend::cpu, threads);
    Tensor mx = poisoned({C}, DType::f32), st = poisoned({C, 2}, DType::f32), ex = copy(logits);
    vocab_parallel_ce_max(ctx, ex, mx);
    vocab_parallel_ce_exp_sum(ctx, ex, mx, targets, V, st);
    vocab_parallel_ce_grad(ctx, ex, st, targets, V, 0.25f);
    grads.push_back(ex);
    stats.push_back(st);
  }
  for (size_t k = 1; k < grads.size(); ++k) {
    EXPECT_EQ(std::memcmp(grads[k].raw(), grads[0].raw(), grads[0].nbytes()), 0) << k;
    EXPECT_EQ(std::memcmp(stats[k].raw(), stats[0].raw(), stats[0].nbytes()), 0) << k;
  }
}

// Columns [c0, c0 + part.dim(1)) of full [C, G] copied out of / into part.
void copy_columns(const Tensor& full, int64_t c0, const Tensor& part, bool into_part) {
  const int64_t C = full.dim(0), G = full.dim(1), W = part.dim(1);
  const auto es = static_cast<int64_t>(full.element_size());
  auto* f = static_cast<char*>(full.raw());
  auto* p = static_cast<char*>(part.raw());
  for (int64_t i = 0; i < C; ++i) {
    char* fr = f + (i * G + c0) * es;
    char* pr = p + i * W * es;
    std::memcpy(into_part ? pr : fr, into_part ? fr : pr, static_cast<size_t>(W * es));
  }
}

struct Composed {
  Tensor losses, grad;
};

// The steps on each slice [bounds[k], bounds[k + 1]) of the vocabulary as
// one rank each would run them, the maxima combined by max and the stats
// by sum in T arithmetic (the all-reduces), in slice order.
template <typename T>
Composed compose(Context& ctx, const Tensor& logits, const Tensor& targets,
                 const std::vector<int64_t>& bounds, float scale) {
  const int64_t C = logits.dim(0), G = logits.dim(1);
  const DType dt = logits.dtype();
  std::vector<Tensor> parts;
  Tensor gmax = poisoned({C}, dt), gstats = Tensor::zeros({C, 2}, dt, MemTag::workspace);
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    parts.push_back(Tensor::empty({C, bounds[k + 1] - bounds[k]}, dt, MemTag::workspace));
    copy_columns(logits, bounds[k], parts.back(), true);
    Tensor mx = poisoned({C}, dt);
    vocab_parallel_ce_max(ctx, parts.back(), mx);
    for (int64_t i = 0; i < C; ++i) {
      T& g = gmax.data<T>()[i];
      g = k == 0 ? mx.data<T>()[i] : std::max(g, mx.data<T>()[i]);
    }
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    Tensor st = poisoned({C, 2}, dt);
    vocab_parallel_ce_exp_sum(ctx, parts[k], gmax, targets, bounds[k], st);
    for (int64_t i = 0; i < 2 * C; ++i) gstats.data<T>()[i] += st.data<T>()[i];
  }
  Composed out{poisoned({C}, dt), poisoned({C, G}, dt)};
  vocab_parallel_ce_loss(ctx, gstats, targets, out.losses);
  for (size_t k = 0; k < parts.size(); ++k) {
    vocab_parallel_ce_grad(ctx, parts[k], gstats, targets, bounds[k], scale);
    copy_columns(out.grad, bounds[k], parts[k], false);
  }
  return out;
}

// Three slices of awkward widths (13, 1, 257 and 1, 257, 13) recombined as
// the all-reduces do give the full-vocabulary cross-entropy: on the CPU
// within the CPU cross-entropy's budgets, on the reference in f64 to ~1e-12.
TEST(VocabParallelCe, ThreeSlicesComposeToFullCrossEntropy) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const std::vector<std::vector<int64_t>> splits = {{0, 13, 14, 271}, {0, 1, 258, 271}};
  for (int64_t C : {1, 7, 33}) {
    for (const std::vector<int64_t>& bounds : splits) {
      const int64_t G = bounds.back();
      const std::string what = "C=" + std::to_string(C) + " split at " + std::to_string(bounds[1]) +
                               ", " + std::to_string(bounds[2]);
      const Tensor logits = random_tensor({C, G}, DType::f32, "full " + what, -4, 4);
      const Tensor logits64 = test::to_dtype(logits, DType::f64);
      const Tensor targets = make_targets(C, G, what);
      const float scale = 1.0f / static_cast<float>(C);
      Tensor loss_full = poisoned({C}, DType::f64), grad_full = poisoned({C, G}, DType::f64);
      cross_entropy(ref, logits64, targets, scale, loss_full, grad_full);

      const Composed c32 = compose<float>(cpu, logits, targets, bounds, scale);
      EXPECT_TRUE(test::all_close(c32.losses, loss_full, kLossTol)) << "cpu " << what;
      EXPECT_TRUE(test::normalized_close(c32.grad, grad_full, kGradTol)) << "cpu " << what;
      const Composed c64 = compose<double>(ref, logits64, targets, bounds, scale);
      EXPECT_TRUE(test::all_close(c64.losses, loss_full, kF64Tol)) << "reference " << what;
      EXPECT_TRUE(test::all_close(c64.grad, grad_full, kF64Tol)) << "reference " << what;
    }
  }
}

TEST(VocabParallelCe, BadInputIsRejected) {
  Context cpu(Backend::cpu);
  const Tensor logits = random_tensor({3, 5}, DType::f32, "bad");
  const Tensor targets = make_targets(3, 5, "bad");
  const Tensor mx = poisoned({3}, DType::f32), st = poisoned({3, 2}, DType::f32);
  EXPECT_THROW(vocab_parallel_ce_max(cpu, random_tensor({3, 5}, DType::bf16, "b"), mx), Error);
  EXPECT_THROW(vocab_parallel_ce_max(cpu, logits, poisoned({4}, DType::f32)), Error);
  EXPECT_THROW(vocab_parallel_ce_exp_sum(cpu, logits, mx, targets, -1, st), Error);
  EXPECT_THROW(vocab_parallel_ce_exp_sum(cpu, logits, mx, targets, 0, poisoned({3}, DType::f32)),
               Error);
  EXPECT_THROW(vocab_parallel_ce_loss(cpu, st, make_targets(2, 5, "short"), mx), Error);
  EXPECT_THROW(vocab_parallel_ce_grad(cpu, logits, poisoned({3, 3}, DType::f32), targets, 0, 1.0f),
               Error);
}

}  // namespace
}  // namespace moetron::kernels
