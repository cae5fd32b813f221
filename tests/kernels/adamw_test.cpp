// AdamW: CPU and CUDA against the fp64 reference over several steps (bias
// correction with step > 1), weight decay, grad_scale, bf16 grads, f32/bf16
// param copies, f32 and bf16 moments.
#include "moetron/kernels/adamw.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// Both backends round the state to fp32 once per step; the CPU's fp32 math
// (sqrt, divide, a few FMAs) adds a few ulps to the update, which is ~lr
// relative to the weight, so the weights agree to ~1e-6 relative. m = b1 m +
// (1 - b1) g can cancel to near zero from terms of size ~0.1-1, so its error
// is a few ulps of those terms (~1e-8 absolute), not of the result.
constexpr test::Tolerance kMaster{2e-6, 1e-7};
constexpr test::Tolerance kMoment{1e-5, 5e-8};
// bf16 copies: the reference rounds the double weight to bf16 once, the CPU
// rounds its fp32 weight: one bf16 ulp (2^-7 relative) apart near ties.
constexpr test::Tolerance kBf16Copy{8e-3, 1e-6};

struct Case {
  DType grad_dtype;
  DType copy_dtype;  // f64 here means: no param_copy
};

// lr 1e-2 with weight decay and a grad_scale: every term of the update is live.
AdamWArgs decaying_scaled_args() {
  AdamWArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  args.grad_scale = 0.5f;
  return args;
}

TEST(AdamW, CpuMatchesReferenceOverSeveralSteps) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const Case cases[] = {{DType::f32, DType::f64},
                        {DType::f32, DType::f32},
                        {DType::bf16, DType::bf16},
                        {DType::bf16, DType::f64}};
  for (const Case& c : cases) {
    for (int64_t n : {1, 7, 33, 130, 70001}) {
      SCOPED_TRACE(testing::Message()
                   << "grad " << dtype_name(c.grad_dtype) << " copy "
                   << (c.copy_dtype == DType::f64 ? "none" : dtype_name(c.copy_dtype))
                   << " n=" << n);
      Tensor w = random_tensor({n}, DType::f32, "w");
      Tensor m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
      Tensor w_ref = w.clone(), m_ref = m.clone(), v_ref = v.clone();
      const bool has_copy = c.copy_dtype != DType::f64;
      Tensor copy = has_copy ? poisoned({n}, c.copy_dtype) : Tensor();
      Tensor copy_ref = has_copy ? poisoned({n}, c.copy_dtype) : Tensor();
      AdamWArgs args = decaying_scaled_args();
      for (int64_t step = 1; step <= 5; ++step) {
        args.step = step;
        Tensor g = random_tensor({n}, c.grad_dtype, str_cat("g", step), -2.0f, 2.0f);
        adamw_step(cpu, w, g, m, v, args, copy);
        adamw_step(ref, w_ref, g, m_ref, v_ref, args, copy_ref);
        EXPECT_TRUE(test::all_close(m, m_ref, kMoment)) << "m, step " << step;
        EXPECT_TRUE(test::all_close(v, v_ref, kMoment)) << "v, step " << step;
        EXPECT_TRUE(test::all_close(w, w_ref, kMaster)) << "master, step " << step;
        if (has_copy) {
          EXPECT_TRUE(
              test::all_close(copy, copy_ref, c.copy_dtype == DType::f32 ? kMaster : kBf16Copy));
          // The copy is exactly the CPU's own master, rounded once.
          EXPECT_TRUE(test::all_close(copy, test::to_dtype(w, c.copy_dtype), {0, 0}));
        }
      }
    }
  }
}

// bf16 moments (optim.moment_dtype): both backends update m and v in their
// own precision and round them to bf16 once per step, after using the
// unrounded values for the update. Near a bf16 tie the fp32 and fp64 values
// round one bf16 ulp (2^-8 relative) apart, and later steps carry that
// difference on scaled by beta: v (a sum of positive terms) agrees to ~2
// ulps relative. m = b1 m + (1 - b1) g can cancel to near zero from terms
// as large as max|m|, so its error is ~2 bf16 ulps of those terms (absolute
// 2^-7 max|m|), not of the result. The weights see it through m / sqrt(v),
// ~1% of an update of size lr = 1e-2: 1e-4 absolute.
constexpr double kBf16MomentRtol = 1.6e-2;
constexpr test::Tolerance kMasterBf16Moments{1e-5, 1e-4};
// The same arithmetic with f32 moments before the store: the portable vector
// backend lets the compiler fuse a * b + c differently per instantiation
// (~1 fp32 ulp, 6e-8 here), far below what rounding the moments first would
// change (~lr 2^-8 = 4e-5).
constexpr test::Tolerance kSameFp32Update{0, 1e-6};

double max_abs(const Tensor& t) {
  const Tensor f = test::to_dtype(t, DType::f32);
  double m = 0;
  for (int64_t i = 0; i < f.numel(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(f.data<float>()[i])));
  return m;
}

TEST(AdamW, Bf16MomentsMatchReferenceAndRoundTheFp32Update) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType grad_dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : {1, 17, 4099}) {
      SCOPED_TRACE(testing::Message() << "grad " << dtype_name(grad_dtype) << " n=" << n);
      Tensor w = random_tensor({n}, DType::f32, "w");
      Tensor m = Tensor::zeros({n}, DType::bf16), v = Tensor::zeros({n}, DType::bf16);
      Tensor w_ref = w.clone(), m_ref = m.clone(), v_ref = v.clone();
      // The same step with fp32 moments: step 1 from zero moments must give
      // the same weights (the update uses the unrounded moments) and moments
      // that round to the bf16 ones (to nearest even).
      Tensor w32 = w.clone(), m32 = Tensor::zeros({n}, DType::f32),
             v32 = Tensor::zeros({n}, DType::f32);
      Tensor copy = poisoned({n}, DType::bf16);
      AdamWArgs args = decaying_scaled_args();
      for (int64_t step = 1; step <= 5; ++step) {
        args.step = step;
        Tensor g = random_tensor({n}, grad_dtype, str_cat("g", step), -2.0f, 2.0f);
        adamw_step(cpu, w, g, m, v, args, copy);
        adamw_step(ref, w_ref, g, m_ref, v_ref, args, Tensor());
        if (step == 1) {
          adamw_step(cpu, w32, g, m32, v32, args, Tensor());
          EXPECT_TRUE(test::all_close(w, w32, kSameFp32Update))
              << "the update must use the fp32 moments";
          EXPECT_TRUE(test::all_close(m, test::to_dtype(m32, DType::bf16), {0, 0}));
          EXPECT_TRUE(test::all_close(v, test::to_dtype(v32, DType::bf16), {0, 0}));
        }
        EXPECT_TRUE(test::all_close(m, m_ref, {kBf16MomentRtol, std::ldexp(max_abs(m_ref), -7)}))
            << "m, step " << step;
        EXPECT_TRUE(test::all_close(v, v_ref, {kBf16MomentRtol, 1e-9})) << "v, step " << step;
        EXPECT_TRUE(test::all_close(w, w_ref, kMasterBf16Moments)) << "master, step " << step;
        EXPECT_TRUE(test::all_close(copy, test::to_dtype(w, DType::bf16), {0, 0}));
      }
    }
  }
  // m and v share one dtype.
  Tensor w = Tensor::zeros({8}, DType::f32), g = Tensor::zeros({8}, DType::f32);
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(adamw_step(*ctx, w, g, Tensor::zeros({8}, DType::bf16),
                            Tensor::zeros({8}, DType::f32), {}, Tensor()),
                 Error);
  }
  EXPECT_THROW(adamw_step(cpu, w, g, Tensor::zeros({8}, DType::f16), Tensor::zeros({8}, DType::f16),
                          {}, Tensor()),
               Error);
}

// bf16 moments over five steps at n 70001: each step's rounding of m and v
// can land one bf16 ulp from the reference's (2^-8 of m, 2^-9 of sqrt v), and
// the weights carry every step's difference in an update of size <~ lr, so
// 5 lr 2^-7 = 3.9e-4 absolute. kMasterBf16Moments (1e-4, one step's worth)
// holds for n <= 4099; at n 70001 two elements need 1.4e-4, on the CPU
// backend exactly as on CUDA (element 43370: -0.718422 vs -0.718283).
constexpr test::Tolerance kMasterBf16MomentsFiveSteps{1e-5, 5 * 1e-2 / 128};

// ctx's backend against the reference on every combination of grad, moment
// and copy dtype, five steps, n up to 70001 (many CUDA blocks, many CPU
// OpenMP blocks); the copy must be exactly the updated master, rounded once.
void adamw_every_dtype_matches_reference(Context& ctx) {
  Context ref(Backend::reference);
  const auto dev = [&](const Tensor& t) { return test::on_device(ctx, t); };
  for (DType gd : {DType::f32, DType::bf16}) {
    for (DType md : {DType::f32, DType::bf16}) {
      for (DType cd : {DType::f64, DType::f32, DType::bf16}) {  // f64: no param_copy
        for (int64_t n : {1, 7, 33, 130, 70001}) {
          SCOPED_TRACE(testing::Message()
                       << "grad " << dtype_name(gd) << " moments " << dtype_name(md) << " copy "
                       << dtype_name(cd) << " n=" << n);
          Tensor w_ref = random_tensor({n}, DType::f32, "w");
          Tensor m_ref = Tensor::zeros({n}, md), v_ref = Tensor::zeros({n}, md);
          // Clones: on the CPU, dev() is the tensor itself.
          Tensor w = dev(w_ref.clone()), m = dev(m_ref.clone()), v = dev(v_ref.clone());
          const bool has_copy = cd != DType::f64;
          Tensor copy = has_copy ? dev(poisoned({n}, cd)) : Tensor();
          AdamWArgs args = decaying_scaled_args();
          for (int64_t step = 1; step <= 5; ++step) {
            args.step = step;
            Tensor g = random_tensor({n}, gd, str_cat("g", step), -2.0f, 2.0f);
            adamw_step(ctx, w, dev(g), m, v, args, copy);
            adamw_step(ref, w_ref, g, m_ref, v_ref, args, Tensor());
          }
          const Tensor wh = test::on_host(w), mh = test::on_host(m), vh = test::on_host(v);
          if (md == DType::f32) {
            EXPECT_TRUE(test::all_close(mh, m_ref, kMoment));
            EXPECT_TRUE(test::all_close(vh, v_ref, kMoment));
            EXPECT_TRUE(test::all_close(wh, w_ref, kMaster));
          } else {
            const double m_floor = std::ldexp(max_abs(m_ref), -7);
            EXPECT_TRUE(test::all_close(mh, m_ref, {kBf16MomentRtol, m_floor}));
            EXPECT_TRUE(test::all_close(vh, v_ref, {kBf16MomentRtol, 1e-9}));
            EXPECT_TRUE(test::all_close(wh, w_ref, kMasterBf16MomentsFiveSteps));
          }
          // The copy is exactly the updated master, rounded once.
          if (has_copy) {
            EXPECT_TRUE(test::all_close(test::on_host(copy), test::to_dtype(wh, cd), {0, 0}));
          }
        }
      }
    }
  }
}

TEST(AdamW, CpuEveryDtypeCombinationMatchesReference) {
  Context cpu(Backend::cpu);
  adamw_every_dtype_matches_reference(cpu);
}

TEST(AdamW, CudaMatchesReferenceOverSeveralSteps) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  adamw_every_dtype_matches_reference(gpu);
}

TEST(AdamW, LateStepsAndLargeScaleMatchReference) {
  // step 1000: the bias corrections are ~1; grad_scale 1/1024 undoes a loss scale.
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t n = 1000;
  Tensor w = random_tensor({n}, DType::f32, "w");
  Tensor m = random_tensor({n}, DType::f32, "m", -0.1f, 0.1f);
  Tensor v = random_tensor({n}, DType::f32, "v", 0.0f, 0.01f);
  Tensor w_ref = w.clone(), m_ref = m.clone(), v_ref = v.clone();
  Tensor g = random_tensor({n}, DType::f32, "g", -1000.0f, 1000.0f);
  AdamWArgs args;
  args.step = 1000;
  args.grad_scale = 1.0f / 1024.0f;
  args.weight_decay = 0.01f;
  adamw_step(cpu, w, g, m, v, args, Tensor());
  adamw_step(ref, w_ref, g, m_ref, v_ref, args, Tensor());
  EXPECT_TRUE(test::all_close(m, m_ref, kMoment));
  EXPECT_TRUE(test::all_close(v, v_ref, kMoment));
  EXPECT_TRUE(test::all_close(w, w_ref, kMaster));
}

// The variance frozen after step 3 (1-bit Adam's compression stage): v is
// left bit-identical, the update uses v with step 3's bias correction, and
// the backend matches the reference; f32 and bf16 moments.
void frozen_variance_matches_reference(Context& ctx) {
  Context ref(Backend::reference);
  for (DType md : {DType::f32, DType::bf16}) {
    for (int64_t n : {5, 130, 70001}) {
      SCOPED_TRACE(testing::Message() << "moments " << dtype_name(md) << " n=" << n);
      Tensor w = random_tensor({n}, DType::f32, "w");
      Tensor m = Tensor::zeros({n}, md), v = Tensor::zeros({n}, md);
      Tensor w_ref = w.clone(), m_ref = m.clone(), v_ref = v.clone();
      Tensor wd = test::on_device(ctx, w), mdv = test::on_device(ctx, m),
             vd = test::on_device(ctx, v);
      AdamWArgs args = decaying_scaled_args();
      args.variance_frozen_at = 3;
      for (int64_t step = 1; step <= 6; ++step) {
        args.step = step;
        const Tensor g = random_tensor({n}, DType::f32, str_cat("g", step), -2.0f, 2.0f);
        const Tensor v_before = test::on_host(vd).clone();
        adamw_step(ctx, wd, test::on_device(ctx, g), mdv, vd, args, Tensor());
        adamw_step(ref, w_ref, g, m_ref, v_ref, args, Tensor());
        const Tensor vh = test::on_host(vd);
        if (step > 3) {
          EXPECT_TRUE(test::all_close(vh, v_before, {0, 0})) << "v moved at step " << step;
        } else {
          EXPECT_FALSE(test::all_close(vh, v_before, {0, 0})) << "v did not move at step " << step;
        }
        const test::Tolerance tol = md == DType::bf16 ? kBf16Copy : kMoment;
        EXPECT_TRUE(test::all_close(test::on_host(mdv), m_ref, tol)) << "m, step " << step;
        EXPECT_TRUE(test::all_close(vh, v_ref, tol)) << "v, step " << step;
        // bf16 moments: each of the 6 steps' roundings may land one ulp from
        // the reference's, as kMasterBf16MomentsFiveSteps explains.
        const test::Tolerance master_tol =
            md == DType::bf16 ? test::Tolerance{1e-5, 6 * 1e-2 / 128} : kMaster;
        EXPECT_TRUE(test::all_close(test::on_host(wd), w_ref, master_tol))
            << "master, step " << step;
      }
    }
  }
}

TEST(AdamW, CpuFrozenVarianceMatchesReference) {
  Context cpu(Backend::cpu);
  frozen_variance_matches_reference(cpu);
}

TEST(AdamW, CudaFrozenVarianceMatchesReference) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  frozen_variance_matches_reference(gpu);
}

TEST(AdamW, FrozenVarianceMakesTheUpdateLinearInTheGradient) {
  // What error feedback relies on: with v frozen and no weight decay, the
  // update of g1 + g2 (two steps' worth of momentum terms) equals the sum of
  // the updates; checked on the reference as the definition.
  Context ref(Backend::reference);
  const int64_t n = 64;
  const Tensor v = random_tensor({n}, DType::f64, "v", 0.01f, 1.0f);
  const Tensor g1 = random_tensor({n}, DType::f64, "g1"), g2 = random_tensor({n}, DType::f64, "g2");
  AdamWArgs args;
  args.step = 10;
  args.variance_frozen_at = 5;
  args.eps = 0;
  const auto update = [&](const Tensor& g) {
    Tensor w = Tensor::zeros({n}, DType::f64), m = Tensor::zeros({n}, DType::f64);
    Tensor vv = v.clone();
    adamw_step(ref, w, g, m, vv, args, Tensor());
    return w;
  };
  Tensor sum = g1.clone();
  for (int64_t i = 0; i < n; ++i) sum.data<double>()[i] += g2.data<double>()[i];
  const Tensor u1 = update(g1), u2 = update(g2), u12 = update(sum);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(u12.data<double>()[i], u1.data<double>()[i] + u2.data<double>()[i], 1e-12);
  }
}

TEST(AdamW, BadInputsAreErrors) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor w = Tensor::zeros({8}, DType::f32), m = Tensor::zeros({8}, DType::f32);
  Tensor v = Tensor::zeros({8}, DType::f32), g = Tensor::zeros({8}, DType::f32);
  AdamWArgs args;
  for (Context* ctx : {&cpu, &ref}) {
    AdamWArgs bad = args;
    bad.step = 0;
    EXPECT_THROW(adamw_step(*ctx, w, g, m, v, bad, Tensor()), Error);
    EXPECT_THROW(adamw_step(*ctx, w, Tensor::zeros({7}, DType::f32), m, v, args, Tensor()), Error);
    EXPECT_THROW(adamw_step(*ctx, w, g, Tensor::zeros({9}, DType::f32), v, args, Tensor()), Error);
    EXPECT_THROW(adamw_step(*ctx, w, g, m, v, args, Tensor::zeros({7}, DType::bf16)), Error);
  }
  // The CPU backend takes f32/bf16 masters (kernels/stochastic_round.h), grads and copies.
  EXPECT_THROW(adamw_step(cpu, Tensor::zeros({8}, DType::f16), g, m, v, args, Tensor()), Error);
  EXPECT_THROW(adamw_step(cpu, w, Tensor::zeros({8}, DType::f16), m, v, args, Tensor()), Error);
  EXPECT_THROW(adamw_step(cpu, w, g, m, v, args, Tensor::zeros({8}, DType::f16)), Error);
}

}  // namespace
}  // namespace moetron::kernels
