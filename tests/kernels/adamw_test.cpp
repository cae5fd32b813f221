// AdamW: CPU against the fp64 reference over several steps (bias correction
// with step > 1), weight decay, grad_scale, bf16 grads, f32/bf16 param copies.
#include "moetron/kernels/adamw.h"

#include <gtest/gtest.h>

#include <string>

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

TEST(AdamW, CpuMatchesReferenceOverSeveralSteps) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const Case cases[] = {{DType::f32, DType::f64},
                        {DType::f32, DType::f32},
                        {DType::bf16, DType::bf16},
                        {DType::bf16, DType::f64}};
  for (const Case& c : cases) {
    for (int64_t n : {1, 7, 33, 130, 70001}) {
      SCOPED_TRACE(testing::Message() << "grad " << dtype_name(c.grad_dtype) << " copy "
                                      << (c.copy_dtype == DType::f64 ? "none" : dtype_name(c.copy_dtype))
                                      << " n=" << n);
      Tensor w = random_tensor({n}, DType::f32, "w");
      Tensor m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
      Tensor w_ref = w.clone(), m_ref = m.clone(), v_ref = v.clone();
      const bool has_copy = c.copy_dtype != DType::f64;
      Tensor copy = has_copy ? poisoned({n}, c.copy_dtype) : Tensor();
      Tensor copy_ref = has_copy ? poisoned({n}, c.copy_dtype) : Tensor();
      AdamWArgs args;
      args.lr = 1e-2f;
      args.weight_decay = 0.1f;
      args.grad_scale = 0.5f;
      for (int64_t step = 1; step <= 5; ++step) {
        args.step = step;
        Tensor g = random_tensor({n}, c.grad_dtype, str_cat("g", step), -2.0f, 2.0f);
        adamw_step(cpu, w, g, m, v, args, copy);
        adamw_step(ref, w_ref, g, m_ref, v_ref, args, copy_ref);
        EXPECT_TRUE(test::all_close(m, m_ref, kMoment)) << "m, step " << step;
        EXPECT_TRUE(test::all_close(v, v_ref, kMoment)) << "v, step " << step;
        EXPECT_TRUE(test::all_close(w, w_ref, kMaster)) << "master, step " << step;
        if (has_copy) {
          EXPECT_TRUE(test::all_close(copy, copy_ref, c.copy_dtype == DType::f32 ? kMaster : kBf16Copy));
          // The copy is exactly the CPU's own master, rounded once.
          EXPECT_TRUE(test::all_close(copy, test::to_dtype(w, c.copy_dtype), {0, 0}));
        }
      }
    }
  }
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
  // The CPU backend keeps master/m/v in f32 and takes f32/bf16 grads and copies.
  EXPECT_THROW(adamw_step(cpu, Tensor::zeros({8}, DType::bf16), g, m, v, args, Tensor()), Error);
  EXPECT_THROW(adamw_step(cpu, w, Tensor::zeros({8}, DType::f16), m, v, args, Tensor()), Error);
  EXPECT_THROW(adamw_step(cpu, w, g, m, v, args, Tensor::zeros({8}, DType::f16)), Error);
}

}  // namespace
}  // namespace moetron::kernels
