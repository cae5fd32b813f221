// 8-bit optimizer state (kernels/quantized_state.h): the code tables, the
// round trip within one code step, the CPU against the brute-force reference
// on awkward sizes, unbiased rounding, AdamW on 8-bit state against the
// reference and against fp32-state AdamW, and the frozen variance.
#include "moetron/kernels/quantized_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/kernels/cpu/state_codes.h"
#include "moetron/kernels/stochastic_round.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::random_tensor;

// Magnitudes spread over 12 binades (1e-4 .. 1), random signs: what a
// moment looks like across a block.
Tensor wide_range(int64_t n, const std::string& name, bool positive, double decades = 4) {
  Tensor t = Tensor::empty({n}, DType::f32);
  PhiloxStream rng(11, name);
  for (int64_t i = 0; i < n; ++i) {
    const double u = (rng.next_u32() >> 8) * (1.0 / (1 << 24));
    const double mag = std::pow(10.0, decades * (u - 1.0));
    t.data<float>()[i] = static_cast<float>(positive || (rng.next_u32() & 1) ? mag : -mag);
  }
  return t;
}

TEST(QuantizedState, CodeTablesAreMonotoneWithTheirMantissasSteps) {
  for (StateCode code : {StateCode::signed_e4m3, StateCode::unsigned_e4m4}) {
    const CodeFormat f = code_format(code);
    const int top = f.top(), first_normal = 1 << f.mantissa_bits;
    const double step = 1.0 / first_normal;
    EXPECT_EQ(code_value(code, 0), 0.0f);
    EXPECT_EQ(code_value(code, static_cast<uint8_t>(top)), 1.0f);
    for (int c = 1; c <= top; ++c) {
      const double lo = code_value(code, static_cast<uint8_t>(c - 1));
      const double hi = code_value(code, static_cast<uint8_t>(c));
      ASSERT_GT(hi, lo) << c;
      // Normal codes (exponent field >= 1): neighbours within one mantissa step.
      if (c > first_normal) {
        EXPECT_LE((hi - lo) / lo, step + 1e-6) << c;
      }
    }
  }
  for (int c = 0; c < 128; ++c) {
    EXPECT_EQ(code_value(StateCode::signed_e4m3, static_cast<uint8_t>(c | 128)),
              -code_value(StateCode::signed_e4m3, static_cast<uint8_t>(c)));
  }
  // 15 binades below the top one: the smallest normal value.
  EXPECT_FLOAT_EQ(code_value(StateCode::signed_e4m3, 8), std::ldexp(1.0f, -14) / 1.875f);
  EXPECT_FLOAT_EQ(code_value(StateCode::unsigned_e4m4, 16), std::ldexp(1.0f, -14) / 1.9375f);
}

// Every decoded value is one of the two codes around x / scale (so within
// a mantissa step of |x| in the normal range, one subnormal step below it), each
// block's largest value is exact, and a positive sqrt(v) never becomes 0.
void expect_round_trip(const Tensor& x, const QuantizedState& q, const Tensor& back) {
  const int64_t n = x.numel();
  for (int64_t b = 0; b < state_scale_count(n); ++b) {
    const float scale = q.scales.data<float>()[b];
    const CodeFormat f = code_format(q.code);
    const double sub_step =
        scale * std::ldexp(1.0, 1 - f.bias() - f.mantissa_bits) / f.max_magnitude();
    const double step = std::ldexp(1.0, -f.mantissa_bits);
    for (int64_t i = b * kStateBlock; i < std::min(n, (b + 1) * kStateBlock); ++i) {
      const double xi = x.data<float>()[i], yi = back.data<float>()[i];
      if (std::fabs(xi) == scale) {
        EXPECT_EQ(yi, xi) << i;
      }
      EXPECT_LE(std::fabs(yi - xi), std::fabs(xi) * step + sub_step + 1e-12 * scale) << i;
      if (q.code == StateCode::unsigned_e4m4 && xi > 0) {
        EXPECT_GT(yi, 0.0) << i;
      }
    }
  }
}

TEST(QuantizedState, CpuMatchesTheReferenceAndRoundTripsWithinOneStep) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (StateCode code : {StateCode::signed_e4m3, StateCode::unsigned_e4m4}) {
    for (int64_t n : {1, 7, 255, 256, 257, 70001}) {
      SCOPED_TRACE(testing::Message() << "code " << static_cast<int>(code) << " n=" << n);
      const Tensor x = wide_range(n, str_cat("x", n), code == StateCode::unsigned_e4m4);
      const QuantizedState q = zero_quantized_state(n, code, MemTag::workspace);
      const QuantizedState qr = zero_quantized_state(n, code, MemTag::workspace);
      const uint32_t key = rounding_key(2, "x", n);
      quantize_state(cpu, x, q, key);
      quantize_state(ref, x, qr, key);
      EXPECT_TRUE(test::all_close(q.scales, qr.scales, {0, 0}));
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i)
        differ += q.codes.data<uint8_t>()[i] != qr.codes.data<uint8_t>()[i];
      // Both draw the same bits; only a value whose fp32 y and the table's
      // fp32 code values disagree in the last bit can round differently.
      EXPECT_LE(differ, n / 1000 + 1);
      Tensor back = Tensor::empty({n}, DType::f32), back_ref = Tensor::empty({n}, DType::f32);
      dequantize_state(cpu, q, back);
      dequantize_state(ref, q, back_ref);
      EXPECT_TRUE(test::all_close(back, back_ref, {0, 0}));
      expect_round_trip(x, q, back);
    }
  }
}

// The CPU kernel (16 values per AVX-512 step, masked tails) against the
// scalar encoder on the same values and bits: identical
// codes, zeros and signs included, block by block.
template <StateCode kCode>
void expect_kernel_codes_equal_scalar_encoder() {
  Context cpu(Backend::cpu);
  const int64_t n = 4099;
  Tensor x = wide_range(n, "vector", kCode == StateCode::unsigned_e4m4);
  for (int64_t i = 0; i < n; i += 97) x.data<float>()[i] = 0.0f;
  const QuantizedState q = zero_quantized_state(n, kCode, MemTag::workspace);
  const uint32_t key = rounding_key(8, "vector", 1);
  quantize_state(cpu, x, q, key);
  const float* vals = x.data<float>();
  for (int64_t j = 0; j < n; ++j) {
    const float amax = q.scales.data<float>()[j / kStateBlock];
    const uint8_t scalar =
        cpu::encode<kCode>(vals[j] / amax, rounding_bits(key, static_cast<uint32_t>(j)));
    ASSERT_EQ(q.codes.data<uint8_t>()[j], scalar) << j;
  }
}

TEST(QuantizedState, KernelCodesEqualTheScalarEncoders) {
  // Without AVX-512 the kernel runs the scalar encoder itself: nothing to compare.
  if (!MOETRON_SIMD_AVX512) GTEST_SKIP() << "built without AVX-512: one encoder only";
  expect_kernel_codes_equal_scalar_encoder<StateCode::signed_e4m3>();
  expect_kernel_codes_equal_scalar_encoder<StateCode::unsigned_e4m4>();
}

TEST(QuantizedState, RoundingIsUnbiased) {
  // 2^16 copies of 0.31 in blocks whose largest value is 1: 0.31 sits
  // between two codes 0.3 and 0.333 apart, and the mean of the decoded
  // values must be 0.31 (sd of the mean ~ 0.033 / 2 / 256 = 6.5e-5; 3e-4
  // is about five of them).
  Context cpu(Backend::cpu);
  const int64_t n = 65536;
  Tensor x = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = i % kStateBlock == 0 ? 1.0f : 0.31f;
  const QuantizedState q = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
  quantize_state(cpu, x, q, rounding_key(4, "x", 1));
  Tensor back = Tensor::empty({n}, DType::f32);
  dequantize_state(cpu, q, back);
  double sum = 0;
  int64_t count = 0, distinct_low = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % kStateBlock == 0) continue;
    sum += back.data<float>()[i];
    ++count;
    distinct_low += back.data<float>()[i] < 0.31f;
  }
  EXPECT_NEAR(sum / static_cast<double>(count), 0.31, 3e-4);
  EXPECT_GT(distinct_low, count / 10);  // both neighbours occur
  EXPECT_LT(distinct_low, count * 9 / 10);
}

AdamWArgs q8_args(int64_t step) {
  AdamWArgs a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  a.step = step;
  return a;
}

// Elements of a and b further apart than tol.
int64_t count_apart(const Tensor& a, const Tensor& b, double tol) {
  int64_t k = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    k += std::fabs(test::element(a, i) - test::element(b, i)) > tol;
  return k;
}

TEST(QuantizedState, CpuAdamWOnEightBitStateMatchesTheReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType gd : {DType::f32, DType::bf16}) {
    for (int64_t n : {1, 7, 33, 257, 70001}) {
      SCOPED_TRACE(testing::Message() << "grad " << dtype_name(gd) << " n=" << n);
      Tensor w = random_tensor({n}, DType::f32, "w"), w_ref = w.clone();
      Tensor copy = test::poisoned({n}, DType::bf16);
      const auto state = [&](StateCode c) { return zero_quantized_state(n, c, MemTag::workspace); };
      QuantizedState m = state(StateCode::signed_e4m3), v = state(StateCode::unsigned_e4m4);
      QuantizedState mr = state(StateCode::signed_e4m3), vr = state(StateCode::unsigned_e4m4);
      for (int64_t step = 1; step <= 5; ++step) {
        const Tensor g = random_tensor({n}, gd, str_cat("g", step), -2.0f, 2.0f);
        const uint32_t mk = rounding_key(1, "m", step), vk = rounding_key(1, "v", step);
        adamw_step_q8(cpu, w, g, m, v, q8_args(step), mk, vk, copy);
        adamw_step_q8(ref, w_ref, g, mr, vr, q8_args(step), mk, vk, Tensor());
      }
      // fp32 against double for almost every element (2e-6 of |w| ~ 1); an
      // element whose code rounded the other way once moves by up to a code
      // step of m (1/16) times lr per step.
      EXPECT_LE(count_apart(w, w_ref, 2e-6), n / 500 + 1);
      EXPECT_EQ(count_apart(w, w_ref, 5 * 1e-2 / 8), 0);
      EXPECT_TRUE(test::all_close(copy, test::to_dtype(w, DType::bf16), {0, 0}));
    }
  }
}

TEST(QuantizedState, AdamWOnEightBitStateTracksFp32State) {
  // 50 steps on 4096 weights with noisy gradients around a fixed direction
  // whose magnitudes span 4 decades within each block: the 8-bit run's total
  // movement agrees with the fp32-state run's to a few percent (RMS of the
  // difference over RMS of the movement; measured 2.9%, and 2.1% over 2 decades).
  Context cpu(Backend::cpu);
  const int64_t n = 4096;
  const Tensor w0 = random_tensor({n}, DType::f32, "w0");
  Tensor w8 = w0.clone(), w32 = w0.clone();
  QuantizedState m8 = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
  QuantizedState v8 = zero_quantized_state(n, StateCode::unsigned_e4m4, MemTag::workspace);
  Tensor m32 = Tensor::zeros({n}, DType::f32), v32 = Tensor::zeros({n}, DType::f32);
  const Tensor direction = wide_range(n, "direction", false);
  AdamWArgs a;
  a.lr = 1e-3f;
  for (int64_t step = 1; step <= 50; ++step) {
    a.step = step;
    Tensor g = random_tensor({n}, DType::f32, str_cat("noise", step), -0.5f, 0.5f);
    for (int64_t i = 0; i < n; ++i) g.data<float>()[i] += direction.data<float>()[i] * 1e3f;
    adamw_step_q8(cpu, w8, g, m8, v8, a, rounding_key(6, "m", step), rounding_key(6, "v", step),
                  Tensor());
    adamw_step(cpu, w32, g, m32, v32, a, Tensor());
  }
  double diff = 0, moved = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = w8.data<float>()[i] - w32.data<float>()[i];
    const double mv = w32.data<float>()[i] - w0.data<float>()[i];
    diff += d * d;
    moved += mv * mv;
  }
  std::printf("8-bit vs fp32 state after 50 steps: rms difference / rms movement = %.4f\n",
              std::sqrt(diff / moved));
  EXPECT_LT(std::sqrt(diff / moved), 0.05);
}

TEST(QuantizedState, CpuFactoredSecondMomentMatchesTheReference) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType wd : {DType::f32, DType::bf16}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {33, 130}, {257, 300}}) {
      SCOPED_TRACE(testing::Message() << "master " << dtype_name(wd) << " " << rows << "x" << cols);
      const int64_t n = rows * cols;
      Tensor w = random_tensor({n}, wd, "w"), w_ref = w.clone();
      QuantizedState m = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
      QuantizedState mr = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
      FactoredMoment v{Tensor::zeros({rows}, DType::f32), Tensor::zeros({cols}, DType::f32)};
      FactoredMoment vr{Tensor::zeros({rows}, DType::f32), Tensor::zeros({cols}, DType::f32)};
      for (int64_t step = 1; step <= 5; ++step) {
        const Tensor g = random_tensor({n}, DType::f32, str_cat("g", step), -2.0f, 2.0f);
        AdamWArgs a = q8_args(step);
        a.rounding_key = rounding_key(1, "w", step);
        const uint32_t mk = rounding_key(1, "m", step);
        adamw_step_q8_factored(cpu, w, g, m, v, a, mk, Tensor());
        adamw_step_q8_factored(ref, w_ref, g, mr, vr, a, mk, Tensor());
      }
      EXPECT_TRUE(test::all_close(v.row, vr.row, {1e-6, 0}));
      EXPECT_TRUE(test::all_close(v.col, vr.col, {1e-6, 0}));
      // As for the unfactored state: rounding in rare elements differs.
      const double tight = wd == DType::f32 ? 2e-6 : 0;
      EXPECT_LE(count_apart(w, w_ref, tight), n / 100 + 1);
      EXPECT_EQ(count_apart(w, w_ref, 5 * 1e-2 / 8 + (wd == DType::bf16 ? 8e-3 : 0)), 0);
    }
  }
}

TEST(QuantizedState, FactoredSecondMomentIsExactForRankOneSquares) {
  // g_ij^2 = a_i b_j: the row and column means give back a_i b_j exactly,
  // so the first step equals AdamW with the full second moment (same m codes).
  Context cpu(Backend::cpu);
  const int64_t rows = 40, cols = 70, n = rows * cols;
  const Tensor a = wide_range(rows, "a", true, 2), b = wide_range(cols, "b", true, 2);
  const Tensor sign = random_tensor({n}, DType::f32, "sign");
  Tensor g = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    const float mag = std::sqrt(a.data<float>()[i / cols] * b.data<float>()[i % cols]);
    g.data<float>()[i] = sign.data<float>()[i] < 0 ? -mag : mag;
  }
  const Tensor w0 = random_tensor({n}, DType::f32, "w");
  Tensor wf = w0.clone(), wq = w0.clone();
  QuantizedState mf = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
  QuantizedState mq = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
  QuantizedState vq = zero_quantized_state(n, StateCode::unsigned_e4m4, MemTag::workspace);
  FactoredMoment vf{Tensor::zeros({rows}, DType::f32), Tensor::zeros({cols}, DType::f32)};
  const AdamWArgs args = q8_args(1);
  adamw_step_q8_factored(cpu, wf, g, mf, vf, args, 9, Tensor());
  adamw_step_q8(cpu, wq, g, mq, vq, args, 9, 10, Tensor());
  EXPECT_TRUE(test::all_close(mf.codes, mq.codes, {0, 0}));
  EXPECT_TRUE(test::all_close(wf, wq, {1e-6, 1e-7}));
}

TEST(QuantizedState, FrozenVarianceKeepsItsCodesAndBadInputsAreErrors) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t n = 300;
  for (Context* ctx : {&cpu, &ref}) {
    Tensor w = random_tensor({n}, DType::f32, "w");
    QuantizedState m = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
    QuantizedState v = zero_quantized_state(n, StateCode::unsigned_e4m4, MemTag::workspace);
    AdamWArgs a = q8_args(1);
    a.variance_frozen_at = 2;
    for (int64_t step = 1; step <= 4; ++step) {
      a.step = step;
      const Tensor codes = v.codes.clone(), scales = v.scales.clone();
      adamw_step_q8(*ctx, w, random_tensor({n}, DType::f32, str_cat("g", step)), m, v, a,
                    rounding_key(1, "m", step), rounding_key(1, "v", step), Tensor());
      if (step > 2) {
        EXPECT_TRUE(test::all_close(v.codes, codes, {0, 0})) << step;
        EXPECT_TRUE(test::all_close(v.scales, scales, {0, 0})) << step;
      }
    }
  }
  Tensor w = Tensor::zeros({n}, DType::f32), g = Tensor::zeros({n}, DType::f32);
  QuantizedState m = zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
  QuantizedState v = zero_quantized_state(n, StateCode::unsigned_e4m4, MemTag::workspace);
  // m and v swapped, a short state, a short scale vector, a bf16 master with a copy.
  EXPECT_THROW(adamw_step_q8(cpu, w, g, v, m, q8_args(1), 0, 0, Tensor()), Error);
  EXPECT_THROW(adamw_step_q8(cpu, w, g,
                             zero_quantized_state(n - 1, StateCode::signed_e4m3, MemTag::workspace),
                             v, q8_args(1), 0, 0, Tensor()),
               Error);
  QuantizedState short_scales = m;
  short_scales.scales = Tensor::zeros({1}, DType::f32);
  EXPECT_THROW(quantize_state(cpu, w, short_scales, 0), Error);
  EXPECT_THROW(adamw_step_q8(cpu, Tensor::zeros({n}, DType::bf16), g, m, v, q8_args(1), 0, 0,
                             Tensor::zeros({n}, DType::bf16)),
               Error);
}

}  // namespace
}  // namespace moetron::kernels
