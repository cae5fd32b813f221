#include "moetron/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "moetron/core/rng.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/newton_schulz.h"
#include "util/test_util.h"

namespace moetron::optim {
namespace {

nn::ParameterSet small_set() {
  nn::ParameterSet ps;
  ps.add("model.layers.0.self_attn.q_proj.weight", {6, 10}, DType::f32, DType::f32,
         nn::ParallelKind::column, nn::InitKind::normal, 0.5f, true);
  ps.add("model.layers.0.self_attn.o_proj.weight", {10, 6}, DType::f32, DType::f32,
         nn::ParallelKind::row, nn::InitKind::normal, 0.5f, true);
  ps.add("model.embed_tokens.weight", {7, 10}, DType::f32, DType::f32, nn::ParallelKind::vocab,
         nn::InitKind::normal, 0.5f, false);
  ps.add("model.norm.weight", {10}, DType::f32, DType::f32, nn::ParallelKind::replicated,
         nn::InitKind::ones, 0, false);
  ps.initialize(1);
  for (const auto& p : ps.all()) fill_uniform(p->grad, 2, p->name + ".grad", -1, 1);
  return ps;
}

TEST(Optimizer, GroupsByKindAndByNamePattern) {
  nn::ParameterSet ps = small_set();
  OptimizerOptions o;
  o.name = "muon";
  o.adamw_patterns = split_patterns(" *.o_proj.weight ,");
  Optimizer opt(ps, o);
  EXPECT_TRUE(opt.uses_muon(ps.get("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_FALSE(opt.uses_muon(ps.get("model.layers.0.self_attn.o_proj.weight")));  // by pattern
  EXPECT_FALSE(opt.uses_muon(ps.get("model.embed_tokens.weight")));  // not a hidden matrix
  EXPECT_FALSE(opt.uses_muon(ps.get("model.norm.weight")));
  EXPECT_EQ(split_patterns("a,,b"), (std::vector<std::string>{"a", "b"}));
}

TEST(Optimizer, MuonStepIsMoonlightsUpdateOfNesterovMomentum) {
  nn::ParameterSet ps = small_set();
  kernels::Context cpu(kernels::Backend::cpu);
  OptimizerOptions o;
  o.name = "muon";
  o.weight_decay = 0.1;
  o.grad_clip = 0;
  o.schedule = {0.02, 1.0, 0, 10};
  Optimizer opt(ps, o);
  nn::Parameter& q = ps.get("model.layers.0.self_attn.q_proj.weight");
  Tensor w0 = q.value.clone();
  // Expected: m = (1 - b) g, u = (1 - b) g + b m, O = NS(u),
  // W = W (1 - lr wd) - lr 0.2 sqrt(max(6, 10)) O.
  const float b = 0.95f;
  Tensor u = q.grad.clone();
  kernels::scale(cpu, u, (1 - b) * (1 + b), u);
  Tensor ns = Tensor::empty(u.shape(), DType::f32);
  newton_schulz(cpu, u, ns, 5);
  opt.step(cpu, 1, 1.0);
  for (int64_t i = 0; i < w0.numel(); ++i) {
    const double expect =
        w0.data<float>()[i] * (1 - 0.02 * 0.1) - 0.02 * 0.2 * std::sqrt(10.0) * ns.data<float>()[i];
    EXPECT_NEAR(q.value.data<float>()[i], expect, 1e-6) << i;
  }
}

TEST(Optimizer, AdamWFirstStepAndNoDecayPatterns) {
  nn::ParameterSet ps = small_set();
  kernels::Context cpu(kernels::Backend::cpu);
  OptimizerOptions o;
  o.weight_decay = 0.5;
  o.grad_clip = 0;
  o.eps = 1e-12;
  o.no_decay_patterns = {"model.embed_*"};
  o.schedule = {0.01, 1.0, 0, 10};
  Optimizer opt(ps, o);
  nn::Parameter& e = ps.get("model.embed_tokens.weight");
  nn::Parameter& w = ps.get("model.layers.0.self_attn.o_proj.weight");
  Tensor e0 = e.value.clone(), w0 = w.value.clone();
  opt.step(cpu, 1, 1.0);
  // Bias-corrected first step: m_hat / sqrt(v_hat) = sign(g).
  for (int64_t i = 0; i < e0.numel(); ++i) {
    const float g = e.grad.data<float>()[i];
    EXPECT_NEAR(e.value.data<float>()[i], e0.data<float>()[i] - 0.01f * (g > 0 ? 1 : -1), 1e-6);
  }
  for (int64_t i = 0; i < w0.numel(); ++i) {
    const float g = w.grad.data<float>()[i];
    const float p = w0.data<float>()[i];
    EXPECT_NEAR(w.value.data<float>()[i], p - 0.01f * (0.5f * p + (g > 0 ? 1 : -1)), 1e-6);
  }
}

TEST(Optimizer, ClipsByTheGlobalNorm) {
  nn::ParameterSet ps = small_set();
  kernels::Context cpu(kernels::Backend::cpu);
  double sq = 0;
  for (const auto& p : ps.all()) sq += kernels::sum_squares(cpu, p->grad);
  OptimizerOptions o;
  o.grad_clip = 0.5;
  Optimizer opt(ps, o);
  const StepInfo info = opt.step(cpu, 1, 2.0);  // grad_scale 2 doubles the norm
  EXPECT_NEAR(info.grad_norm, 2.0 * std::sqrt(sq), 1e-9 * info.grad_norm);
  EXPECT_NEAR(info.clip_coef, 0.5 / (info.grad_norm + 1e-6), 1e-12);
}

TEST(Optimizer, Bf16MomentsRoundTheFp32StateOncePerStep) {
  kernels::Context cpu(kernels::Backend::cpu);
  for (const char* name : {"adamw", "muon"}) {
    SCOPED_TRACE(name);
    nn::ParameterSet ps32 = small_set(), ps16 = small_set();
    OptimizerOptions o;
    o.name = name;
    o.grad_clip = 0;
    o.schedule = {0.02, 1.0, 0, 10};
    Optimizer opt32(ps32, o);
    o.moment_dtype = DType::bf16;
    Optimizer opt16(ps16, o);
    // Step 1 from zero state: the same fp32 update, the state rounded once.
    opt32.step(cpu, 1, 1.0);
    opt16.step(cpu, 1, 1.0);
    const std::vector<StateTensor> s32 = opt32.state(), s16 = opt16.state();
    ASSERT_EQ(s32.size(), s16.size());
    for (size_t i = 0; i < s32.size(); ++i) {
      EXPECT_EQ(s16[i].tensor.dtype(), DType::bf16) << s16[i].name;
      EXPECT_TRUE(
          test::all_close(s16[i].tensor, test::to_dtype(s32[i].tensor, DType::bf16), {0, 0}))
          << s16[i].name;
    }
    // (1e-6: the compiler may fuse a * b + c differently per kernel
    // instantiation, ~1 fp32 ulp; a rounded moment would move ~lr 2^-8 = 8e-5.)
    for (const auto& p : ps32.all()) {
      EXPECT_TRUE(test::all_close(ps16.get(p->name).value, p->value, {0, 1e-6})) << p->name;
      EXPECT_EQ(opt16.master(p->name).dtype(), DType::f32);  // masters stay fp32
    }
    // Later steps differ by the rounding only: ~1% of an update of ~lr.
    for (int64_t step = 2; step <= 4; ++step) {
      opt32.step(cpu, step, 1.0);
      opt16.step(cpu, step, 1.0);
    }
    for (const auto& p : ps32.all()) {
      EXPECT_TRUE(test::all_close(ps16.get(p->name).value, p->value, {0, 2e-3})) << p->name;
    }
  }
}

TEST(Optimizer, Bf16GradientsKeepFp32Masters) {
  // A bf16 working copy with a bf16 gradient (train.grad_dtype = bf16): the
  // master is fp32 (not the gradient's dtype) and both rules read the grad.
  kernels::Context cpu(kernels::Backend::cpu);
  for (const char* name : {"adamw", "muon"}) {
    SCOPED_TRACE(name);
    nn::ParameterSet ps16, ps32;
    for (nn::ParameterSet* ps : {&ps16, &ps32}) {
      const DType g = ps == &ps16 ? DType::bf16 : DType::f32;
      ps->add("model.layers.0.mlp.down_proj.weight", {12, 8}, DType::bf16, g, nn::ParallelKind::row,
              nn::InitKind::normal, 0.5f, true);
      ps->initialize(3);
    }
    Tensor g32 = Tensor::empty({12, 8}, DType::f32);
    fill_uniform(g32, 4, "g", -1, 1);
    kernels::convert(cpu, g32, ps16.get("model.layers.0.mlp.down_proj.weight").grad);
    // The fp32-gradient run gets the same (bf16-representable) values.
    kernels::convert(cpu, ps16.get("model.layers.0.mlp.down_proj.weight").grad,
                     ps32.get("model.layers.0.mlp.down_proj.weight").grad);
    OptimizerOptions o;
    o.name = name;
    o.grad_clip = 0.5;
    o.schedule = {0.02, 1.0, 0, 10};
    Optimizer a(ps16, o), b(ps32, o);
    EXPECT_EQ(a.master("model.layers.0.mlp.down_proj.weight").dtype(), DType::f32);
    const StepInfo ia = a.step(cpu, 1, 1.0), ib = b.step(cpu, 1, 1.0);
    EXPECT_DOUBLE_EQ(ia.grad_norm, ib.grad_norm);
    EXPECT_TRUE(test::all_close(a.master("model.layers.0.mlp.down_proj.weight"),
                                b.master("model.layers.0.mlp.down_proj.weight"), {0, 0}));
  }
}

TEST(LrSchedule, WarmupThenCosineToTheFloor) {
  const LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway through the decay
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
}

}  // namespace
}  // namespace moetron::optim
