// Preconditioned compression in the gradient reducer (under mpirun, 2 and 4
// ranks): the reduced gradient is d * (the sum of the ranks' decoded
// encodings of g / d), for both reduction modes; per-element d may be set
// by different ranks (ZeRO-1's shards) and is completed by a max over dp; a
// tensor without a second moment gets the RMS of its last reduced gradient;
// a clamp holds back what exceeds it in the residual; and in the update's units (g / d) the error
// stays at the block's scale, where gradient-space compression gives a coordinate with a small d
// its block's mean gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/nn/parameter.h"
#include "moetron/parallel/grad_reducer.h"
#include "util/mpi_test_main.h"

namespace moetron::parallel {
namespace {

comm::Communicator& world() {
  return test::mpi_world();
}

constexpr int64_t kA = 37;                // a vector with AdamW's second moment
constexpr int64_t kRows = 3, kCols = 20;  // a matrix without one (Muon's)

// Gradients of `rank` at `step`: smooth in the index, different per rank.
float grad_value(int64_t rank, int64_t step, int64_t param, int64_t i) {
  return static_cast<float>(0.01 * std::sin(0.37 * static_cast<double>(i) + 1.3 * rank + step) +
                            0.002 * param);
}
// AdamW's denominator of element i of "a": spans four orders of magnitude.
float denominator(int64_t i) {
  return static_cast<float>(std::pow(10.0, -4.0 + 4.0 * static_cast<double>(i % 7) / 6.0));
}

struct Fixture {
  nn::ParameterSet params;
  nn::Parameter *a, *b;
  Fixture() {
    a = &params.add("a", {kA}, DType::f32, DType::f32, nn::ParallelKind::replicated,
                    nn::InitKind::zeros, 0, false);
    b = &params.add("b", {kRows, kCols}, DType::f32, DType::f32, nn::ParallelKind::replicated,
                    nn::InitKind::zeros, 0, true);
  }
  void fill_grads(int64_t rank, int64_t step) {
    for (int64_t i = 0; i < kA; ++i) a->grad.data<float>()[i] = grad_value(rank, step, 0, i);
    for (int64_t i = 0; i < kRows * kCols; ++i)
      b->grad.data<float>()[i] = grad_value(rank, step, 1, i);
  }
  void backward(GradReducer& r, kernels::Context& ctx, int64_t step) {
    fill_grads(world().rank(), step);
    r.arm(step);
    r.grad_ready(ctx, *b);
    r.grad_ready(ctx, *a);
    r.finish(ctx);
  }
};

// What rank `rank`'s bucket holds at `step`, in bucket order.
std::vector<float> flat_of(const Bucket& bk, int64_t rank, int64_t step) {
  std::vector<float> flat(static_cast<size_t>(bk.numel), 0.0f);
  for (const BucketSlot& slot : bk.slots) {
    const int64_t param = slot.param->name == "a" ? 0 : 1;
    for (int64_t i = 0; i < slot.numel; ++i)
      flat[static_cast<size_t>(slot.offset + i)] = grad_value(rank, step, param, i);
  }
  return flat;
}

std::vector<float> decoded(const CompressOptions& o, const float* x, int64_t n) {
  std::vector<uint8_t> enc(static_cast<size_t>(encoded_bytes(o, n)));
  encode(o, x, n, enc.data());
  std::vector<float> y(static_cast<size_t>(n), 0.0f);
  decode_add(o, enc.data(), n, y.data());
  return y;
}

void check_mode(ReduceMode mode, float clamp = 0) {
  kernels::Context ctx;
  Fixture f;
  ReducerOptions opts;
  opts.mode = mode;
  opts.compress = {CompressKind::sign, 8};
  opts.warmup_steps = 1;
  GradReducer r(f.params, world(), opts);
  ASSERT_EQ(r.buckets().size(), 1u);
  f.backward(r, ctx, 1);  // uncompressed

  // Each rank knows the denominators of its share of "a" only (as ZeRO-1's
  // shards do); the max over dp completes them.
  const int64_t n = world().size(), me = world().rank();
  r.begin_preconditioner(clamp);
  const int64_t lo = kA * me / n, hi = kA * (me + 1) / n;
  const Tensor d = Tensor::empty({hi - lo}, DType::f32);
  for (int64_t i = lo; i < hi; ++i) d.data<float>()[i - lo] = denominator(i);
  EXPECT_TRUE(r.set_denominator("a", lo, d));
  EXPECT_FALSE(r.set_denominator("not-carried", 0, d));
  r.finish_preconditioner();
  ASSERT_TRUE(r.preconditioned());

  // "b" has one scale: the RMS of its step-1 sum over ranks.
  double sumsq = 0;
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    double g = 0;
    for (int64_t q = 0; q < n; ++q) g += grad_value(q, 1, 1, i);
    sumsq += g * g;
  }
  const auto scales = r.tensor_scales();
  ASSERT_EQ(scales.size(), 1u);
  EXPECT_NEAR(scales.at("b"), std::sqrt(sumsq / (kRows * kCols)), 1e-6 * scales.at("b"));

  f.backward(r, ctx, 2);  // compressed
  const Bucket& bk = r.buckets()[0];
  double resid_sq = 0;
  for (int64_t i = 0; i < bk.numel; ++i)
    resid_sq += double{bk.residual.data<float>()[i]} * bk.residual.data<float>()[i];
  EXPECT_GT(resid_sq, 0);
  EXPECT_NEAR(r.last_residual_rms(), std::sqrt(resid_sq / static_cast<double>(bk.numel)),
              1e-9 + 1e-6 * r.last_residual_rms());
  const float* scale = bk.scale.data<float>();
  for (const BucketSlot& slot : bk.slots) {
    for (int64_t i = 0; i < slot.numel; ++i) {
      const float want = slot.param->name == "a" ? denominator(i) : scales.at("b");
      ASSERT_EQ(scale[slot.offset + i], want) << slot.param->name << "[" << i << "]";
    }
  }
  // The first hop: each rank encodes its g / d chunk by chunk; chunk j's sum.
  std::vector<float> sum(static_cast<size_t>(bk.numel), 0.0f);
  for (int64_t q = 0; q < n; ++q) {
    std::vector<float> x = flat_of(bk, q, 2);
    for (int64_t i = 0; i < bk.numel; ++i) {
      float& xi = x[static_cast<size_t>(i)];
      xi /= scale[i];
      if (clamp > 0) xi = std::clamp(xi, -clamp, clamp);
    }
    for (int64_t j = 0; j < n; ++j) {
      const std::vector<float> y = decoded(opts.compress, x.data() + j * bk.chunk, bk.chunk);
      for (int64_t i = 0; i < bk.chunk; ++i) sum[static_cast<size_t>(j * bk.chunk + i)] += y[i];
    }
  }
  if (mode == ReduceMode::reduce_scatter) {
    for (int64_t i = 0; i < bk.chunk; ++i) {
      const size_t k = static_cast<size_t>(me * bk.chunk + i);
      EXPECT_FLOAT_EQ(bk.shard.data<float>()[i], sum[k] * scale[k]) << "element " << k;
    }
    // What the clamp held back stays owed: residual = (g / d - decode(clamped)) * d.
    if (clamp > 0) {
      std::vector<float> x = flat_of(bk, me, 2);
      int64_t held = 0;
      for (int64_t i = 0; i < bk.numel; ++i) {
        x[static_cast<size_t>(i)] /= scale[i];
        held += std::fabs(x[static_cast<size_t>(i)]) > clamp;
      }
      EXPECT_GT(held, 0) << "the clamp never bit: the test shows nothing";
      for (int64_t j = 0; j < n; ++j) {
        std::vector<float> c(x.begin() + j * bk.chunk, x.begin() + (j + 1) * bk.chunk);
        for (float& v : c) v = std::clamp(v, -clamp, clamp);
        const std::vector<float> y = decoded(opts.compress, c.data(), bk.chunk);
        for (int64_t i = 0; i < bk.chunk; ++i) {
          const size_t k = static_cast<size_t>(j * bk.chunk + i);
          // Owed in the gradient's units: (g / d - decoded) * d.
          EXPECT_FLOAT_EQ(bk.residual.data<float>()[k],
                          (x[k] - y[static_cast<size_t>(i)]) * scale[k])
              << "element " << k;
        }
      }
    }
    return;
  }
  // The second hop (allreduce): each chunk's sum encoded once more by its owner.
  for (int64_t j = 0; j < n; ++j) {
    const std::vector<float> y = decoded(opts.compress, sum.data() + j * bk.chunk, bk.chunk);
    for (int64_t i = 0; i < bk.chunk; ++i) {
      const int64_t k = j * bk.chunk + i;
      EXPECT_FLOAT_EQ(bk.flat.data<float>()[k], y[static_cast<size_t>(i)] * scale[k])
          << "element " << k;
    }
  }
  for (const BucketSlot& slot : bk.slots) {
    for (int64_t i = 0; i < slot.numel; ++i)
      ASSERT_EQ(slot.param->grad.data<float>()[i], bk.flat.data<float>()[slot.offset + i]);
  }
}

TEST(GradReducerPrecondition, ReduceScatterSumsTheDecodedUpdatesTimesTheDenominator) {
  check_mode(ReduceMode::reduce_scatter);
}

TEST(GradReducerPrecondition, TheClampHoldsBackWhatExceedsItInTheResidual) {
  check_mode(ReduceMode::reduce_scatter, 20.0f);
}

TEST(GradReducerPrecondition, AllreduceEncodesTheSumInTheSameSpace) {
  check_mode(ReduceMode::allreduce);
}

// One block of 8: half the coordinates with d = 1, half with d = 1e-3, and
// gradients g = d * u with |u| <= 1 (updates of the same size). Encoded as
// gradients, the small-d coordinates take the block's mean |g| (about 0.5)
// and move by 0.5 / 1e-3 in the update's units; encoded as g / d, by at
// most mean |u| + |u| <= 2.
TEST(GradReducerPrecondition, TheErrorIsBoundedInTheUpdatesUnits) {
  const CompressOptions o{CompressKind::sign, 8};
  const std::vector<float> d = {1, 1e-3f, 1, 1e-3f, 1, 1e-3f, 1, 1e-3f};
  const std::vector<float> u = {0.9f, -0.7f, 0.4f, 0.8f, -1.0f, 0.3f, 0.6f, -0.5f};
  std::vector<float> g(8), x(8);
  for (size_t i = 0; i < 8; ++i) {
    g[i] = d[i] * u[i];
    x[i] = u[i];
  }
  const std::vector<float> plain = decoded(o, g.data(), 8), pre = decoded(o, x.data(), 8);
  float worst_plain = 0, worst_pre = 0;
  for (size_t i = 0; i < 8; ++i) {
    worst_plain = std::max(worst_plain, std::fabs(plain[i] - g[i]) / d[i]);
    worst_pre = std::max(worst_pre, std::fabs(pre[i] * d[i] - g[i]) / d[i]);
  }
  EXPECT_GT(worst_plain, 100.0f);
  EXPECT_LE(worst_pre, 2.0f);
}

}  // namespace
}  // namespace moetron::parallel
