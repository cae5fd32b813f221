// Stochastic rounding to bf16 (kernels/stochastic_round.h) and the two
// kernels that store bf16 master weights with it: adamw_step with a bf16
// master and master_update (Muon's last step). Checked: the rounding is
// exactly unbiased over its 2^16 random values, the bits are reproducible
// and well spread, each backend matches the fp64 reference to one bf16 ulp
// on awkward sizes, and an update far below an ulp survives in the mean
// where round-to-nearest would drop it.
#include "moetron/kernels/stochastic_round.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/master_update.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::random_tensor;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float bf16_value(uint16_t b) {
  return bf16_to_f32(b);
}

TEST(StochasticRound, MeanOverAllRandomValuesIsTheValueExactly) {
  // Positive and negative, just below a power of two (the carry crosses a
  // binade), tiny and subnormal magnitudes, and values bf16 holds exactly.
  const std::vector<float> xs = {1.0f - 1e-4f, -(1.0f - 1e-4f), 0.3f,     -123.456f, 1e-30f,
                                 1e-39f,       3.0e38f,         0.99999f, 2.0f,      -0.5f,
                                 1.00390625f,  65504.3f,        -7e-5f};
  for (float x : xs) {
    SCOPED_TRACE(x);
    double sum = 0;
    const uint16_t down = static_cast<uint16_t>(bits_of(x) >> 16);
    for (uint32_t r = 0; r < 65536; ++r) {
      const uint16_t b = bf16_bits_stochastic(bits_of(x), r);
      // Always one of the two neighbours: truncated, or one ulp away from zero.
      ASSERT_TRUE(b == down || b == static_cast<uint16_t>(down + 1)) << r;
      sum += static_cast<double>(bf16_value(b));
    }
    EXPECT_EQ(sum / 65536.0, static_cast<double>(x));
  }
}

TEST(StochasticRound, ExactValuesInfAndNanAreKept) {
  for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 0.0078125f}) {
    for (uint32_t r : {0u, 1u, 0x7fffu, 0xffffu, 0xdeadbeefu})
      EXPECT_EQ(bf16_bits_stochastic(bits_of(x), r), bits_of(x) >> 16) << x << " " << r;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_value(bf16_bits_stochastic(bits_of(inf), 0xffffu)), inf);
  EXPECT_EQ(bf16_value(bf16_bits_stochastic(bits_of(-inf), 0xffffu)), -inf);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(bf16_value(bf16_bits_stochastic(bits_of(nan), 0xffffu))));
  // A NaN whose payload sits only in the low 16 bits stays a NaN.
  EXPECT_TRUE(std::isnan(bf16_value(bf16_bits_stochastic(0x7f800001u, 0))));
}

TEST(StochasticRound, BitsAreReproducibleAndSpreadEvenly) {
  // 16 buckets of the low 16 bits (the ones the rounding uses) over 2^16
  // indices: each within 5% of 4096 (a chi-square at this n has sd ~64).
  std::vector<int> buckets(16, 0);
  const uint32_t key = rounding_key(7, "model.layers.0.mlp.gate_proj.weight", 3);
  for (uint32_t i = 0; i < 65536; ++i) ++buckets[(rounding_bits(key, i) & 0xffffu) >> 12];
  for (int b : buckets) EXPECT_NEAR(b, 4096, 205);
  // Same inputs, same bits; another step, name or seed, another stream.
  EXPECT_EQ(rounding_key(7, "a", 3), rounding_key(7, "a", 3));
  const uint32_t others[] = {rounding_key(7, "a", 4), rounding_key(7, "b", 3),
                             rounding_key(8, "a", 3)};
  for (uint32_t other : others) {
    EXPECT_NE(other, rounding_key(7, "a", 3));
    int same = 0;
    for (uint32_t i = 0; i < 4096; ++i)
      same += (rounding_bits(other, i) & 0xffffu) ==
              (rounding_bits(rounding_key(7, "a", 3), i) & 0xffffu);
    EXPECT_LE(same, 3);
  }
}

// Elements where a and b differ, and whether every difference is at most
// one bf16 ulp (2^-7 relative bounds an ulp of a normal bf16 value) plus
// `slack` (what differences in the state before the rounding may add).
struct UlpDiff {
  int64_t differ = 0;
  bool within_one_ulp = true;
};
UlpDiff compare_bf16(const Tensor& a, const Tensor& b, double slack = 0) {
  UlpDiff d;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = test::element(a, i), y = test::element(b, i);
    if (x == y) continue;
    ++d.differ;
    if (std::fabs(x - y) > std::ldexp(std::fabs(y), -7) + slack) {
      d.within_one_ulp = false;
      ADD_FAILURE() << "element " << i << ": " << x << " vs " << y;
    }
  }
  return d;
}

AdamWArgs bf16_master_args() {
  AdamWArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  args.grad_scale = 0.5f;
  return args;
}

// ctx's backend against the reference: both round the same fp32 value with
// the same bits, so they differ only where ctx's fp32 arithmetic (FMAs, a
// few ulps) lands on the other side of the element's random threshold,
// about one element in 2^14 per step; such an element stays one ulp apart.
// bf16 moments add what adamw_test.cpp measures for them: a moment rounded
// one bf16 ulp from the reference's moves the update by ~1% of lr, up to
// 5 lr 2^-7 over five steps, which for a weight near zero exceeds its ulp.
void adamw_bf16_master_matches_reference(Context& ctx) {
  Context ref(Backend::reference);
  const auto dev = [&](const Tensor& t) { return test::on_device(ctx, t); };
  for (DType gd : {DType::f32, DType::bf16}) {
    for (DType md : {DType::f32, DType::bf16}) {
      for (int64_t n : {1, 7, 33, 130, 70001}) {
        SCOPED_TRACE(testing::Message()
                     << "grad " << dtype_name(gd) << " moments " << dtype_name(md) << " n=" << n);
        Tensor w_ref = random_tensor({n}, DType::bf16, "w");
        Tensor m_ref = Tensor::zeros({n}, md), v_ref = Tensor::zeros({n}, md);
        Tensor w = dev(w_ref.clone()), m = dev(m_ref.clone()), v = dev(v_ref.clone());
        AdamWArgs args = bf16_master_args();
        for (int64_t step = 1; step <= 5; ++step) {
          args.step = step;
          args.rounding_key = rounding_key(1, "w", step);
          Tensor g = random_tensor({n}, gd, str_cat("g", step), -2.0f, 2.0f);
          adamw_step(ctx, w, dev(g), m, v, args, Tensor());
          adamw_step(ref, w_ref, g, m_ref, v_ref, args, Tensor());
        }
        const double slack = md == DType::bf16 ? 5 * 1e-2 / 128 : 0;
        const UlpDiff d = compare_bf16(test::on_host(w), w_ref, slack);
        EXPECT_TRUE(d.within_one_ulp);
        EXPECT_LE(d.differ, n / 200 + 1) << d.differ << " elements differ";
      }
    }
  }
  // A bf16 master is the working copy: a separate copy is refused.
  Tensor w = dev(Tensor::zeros({8}, DType::bf16)), g = dev(Tensor::zeros({8}, DType::f32));
  Tensor m = dev(Tensor::zeros({8}, DType::f32)), v = dev(Tensor::zeros({8}, DType::f32));
  EXPECT_THROW(adamw_step(ctx, w, g, m, v, {}, dev(Tensor::zeros({8}, DType::bf16))), Error);
}

TEST(StochasticRound, CpuAdamWWithABf16MasterMatchesReference) {
  Context cpu(Backend::cpu);
  adamw_bf16_master_matches_reference(cpu);
}

TEST(StochasticRound, CudaAdamWWithABf16MasterMatchesReference) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  adamw_bf16_master_matches_reference(gpu);
}

double mean_of(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += test::element(t, i);
  return s / static_cast<double>(t.numel());
}

// 2^16 weights at 1.0 and a constant gradient: every AdamW step moves each
// by exactly -lr = -1e-4, 1/39 of the bf16 ulp below 1.0 (2^-8). Round to
// nearest would leave all of them at 1.0 forever; stochastic rounding moves
// the mean by 20 lr over 20 steps. The mean's sd is ~3.4e-6 (each element a
// sum of 20 Bernoulli(0.026) ulps), so 2e-5 is six of them.
void small_updates_survive_in_the_mean(Context& ctx) {
  ASSERT_EQ(f32_to_bf16(1.0f - 1e-4f), f32_to_bf16(1.0f));  // what round to nearest would do
  const int64_t n = 65536;
  const auto dev = [&](const Tensor& t) { return test::on_device(ctx, t); };
  Tensor ones = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.0f;
  Tensor w = dev(test::to_dtype(ones, DType::bf16)), g = dev(ones);
  Tensor m = dev(Tensor::zeros({n}, DType::f32)), v = dev(Tensor::zeros({n}, DType::f32));
  AdamWArgs args;
  args.lr = 1e-4f;
  for (int64_t step = 1; step <= 20; ++step) {
    args.step = step;
    args.rounding_key = rounding_key(3, "w", step);
    adamw_step(ctx, w, g, m, v, args, Tensor());
  }
  EXPECT_NEAR(mean_of(test::on_host(w)), 1.0 - 20 * 1e-4, 2e-5);
  // master_update's decay alone, 0.9999^20 = 0.998002: the same in the mean.
  Tensor u = dev(Tensor::zeros({n}, DType::f32));
  Tensor w2 = dev(test::to_dtype(ones, DType::bf16));
  if (ctx.backend() == Backend::cuda) return;  // master_update is host-only
  for (int64_t step = 1; step <= 20; ++step)
    master_update(ctx, w2, 0.9999f, 0.0f, u, rounding_key(4, "w2", step));
  EXPECT_NEAR(mean_of(w2), std::pow(0.9999, 20), 2e-5);
}

TEST(StochasticRound, CpuSmallUpdatesSurviveInTheMean) {
  Context cpu(Backend::cpu);
  small_updates_survive_in_the_mean(cpu);
}

TEST(StochasticRound, ReferenceSmallUpdatesSurviveInTheMean) {
  Context ref(Backend::reference);
  small_updates_survive_in_the_mean(ref);
}

TEST(StochasticRound, CudaSmallUpdatesSurviveInTheMean) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  small_updates_survive_in_the_mean(gpu);
}

TEST(MasterUpdate, CpuMatchesReferenceForF32AndBf16Masters) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType wd : {DType::f32, DType::bf16}) {
    for (DType ud : {DType::f32, DType::bf16}) {
      for (int64_t n : {1, 7, 33, 130, 70001}) {
        SCOPED_TRACE(testing::Message()
                     << "master " << dtype_name(wd) << " update " << dtype_name(ud) << " n=" << n);
        Tensor w_ref = random_tensor({n}, wd, "w");
        Tensor w = w_ref.clone();
        for (int64_t step = 1; step <= 3; ++step) {
          const Tensor u = random_tensor({n}, ud, str_cat("u", step));
          const uint32_t key = rounding_key(5, "w", step);
          master_update(cpu, w, 0.999f, -3e-3f, u, key);
          master_update(ref, w_ref, 0.999f, -3e-3f, u, key);
        }
        if (wd == DType::f32) {
          // One fused multiply-add against double: an fp32 ulp or two per step.
          EXPECT_TRUE(test::all_close(w, w_ref, {1e-6, 1e-7}));
        } else {
          const UlpDiff d = compare_bf16(w, w_ref);
          EXPECT_TRUE(d.within_one_ulp);
          EXPECT_LE(d.differ, n / 200 + 1);
        }
      }
    }
  }
  EXPECT_THROW(master_update(cpu, Tensor::zeros({4}, DType::bf16), 1.0f, 1.0f,
                             Tensor::zeros({5}, DType::f32), 0),
               Error);
}

}  // namespace
}  // namespace moetron::kernels
