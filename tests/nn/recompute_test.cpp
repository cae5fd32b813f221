// Activation recomputation: every policy (and each module alone) gives the
// gradients, losses and expert loads of `none`, routes every token the same
// way in the recomputed forward, and really holds fewer activation bytes.
#include "moetron/nn/recompute.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "moetron/core/rng.h"
#include "moetron/nn/transformer.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 37;
  m.d_model = 32;
  m.n_layers = 5;  // sqrt: k = 3, segments [0, 3) and [3, 5)
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.max_seq_len = 32;
  m.init_std = 0.1;
  return m;
}

MoeConfig small_moe() {
  MoeConfig e;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_hidden = 24;
  e.first_dense_layers = 1;
  e.shared_experts = 1;
  e.shared_expert_hidden = 16;
  e.aux_loss_coef = 0.05;
  e.z_loss_coef = 0.01;
  return e;
}

struct Run {
  LossStats loss;
  std::vector<Tensor> grads;
  std::vector<std::vector<int64_t>> loads;
  int64_t routing_checks = 0;
  int64_t activation_peak = 0;
};

Run run(const RecomputePolicy& policy, Precision prec, const MoeConfig& moe,
        int micro_batches = 2) {
  kernels::Context cpu(kernels::Backend::cpu);
  Transformer model(small_model(), moe, prec);
  model.initialize(11);
  model.set_recompute(policy);
  Tensor in = Tensor::empty({3, 29}, DType::i32), tgt = Tensor::empty({3, 29}, DType::i32);
  PhiloxStream rng(5, "tokens");
  for (int64_t i = 0; i < in.numel(); ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % 37);
    tgt.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % 37);
  }
  model.params().zero_grads();
  Run r;
  Allocator& alloc = cpu_allocator();
  alloc.reset_peaks();
  const int64_t before = alloc.current(MemTag::activations);
  for (int m = 0; m < micro_batches; ++m) {  // accumulation across micro-batches, too
    const LossStats st = model.forward_backward(cpu, in, tgt, 1.0 / 87, 0.5, true);
    r.loss.ce_sum += st.ce_sum;
    r.loss.aux_loss += st.aux_loss;
    r.loss.z_loss += st.z_loss;
  }
  r.activation_peak = alloc.peak(MemTag::activations) - before;
  EXPECT_EQ(alloc.current(MemTag::activations), before)
      << "activations left behind by " << describe(policy);
  for (const auto& p : model.params().all()) r.grads.push_back(p->grad.clone());
  for (MoeLayer* l : model.moe_layers()) {
    r.loads.push_back(l->expert_load());
    r.routing_checks += l->routing_checks();
  }
  return r;
}

std::vector<RecomputePolicy> all_policies(int64_t layers) {
  std::vector<RecomputePolicy> v;
  for (const char* p : {"selective", "full", "sqrt"})
    v.push_back(make_recompute_policy(p, {}, layers));
  for (const auto& m : recompute_module_names())
    v.push_back(make_recompute_policy("custom", {m}, layers));
  v.push_back(make_recompute_policy("custom", recompute_module_names(), layers));
  // The residual rebuilt through a dropped attention output, q, k, v and input.
  v.push_back(make_recompute_policy(
      "custom", {"attn_core", "attn_q", "attn_kv", "attn_residual", "norm"}, layers));
  v.push_back(make_recompute_policy("sqrt", {}, layers, 2));
  return v;
}

void expect_same_as_none(Precision prec, const MoeConfig& moe) {
  const Run base = run(RecomputePolicy{}, prec, moe);
  const int64_t moe_layers = static_cast<int64_t>(base.loads.size());
  ASSERT_GT(moe_layers, 0);
  for (const RecomputePolicy& p : all_policies(small_model().n_layers)) {
    SCOPED_TRACE(describe(p));
    const Run r = run(p, prec, moe);
    EXPECT_EQ(r.loss.ce_sum, base.loss.ce_sum);
    EXPECT_EQ(r.loss.aux_loss, base.loss.aux_loss);
    EXPECT_EQ(r.loss.z_loss, base.loss.z_loss);
    // The recomputed forward counts no load: the loads are the first forward's.
    EXPECT_EQ(r.loads, base.loads);
    // The same kernels on the same inputs: equal to rounding (in practice
    // bit for bit; 1e-6 of the gradient's scale is fp32 rounding). moe_out
    // forms the combine weights' gradient as d_act . act and weights d_act
    // after the down projection: other roundings of the same sums, 1e-5 in
    // fp32, and in bf16 a few roundings (2^-8 each) of the largest element
    // after five layers.
    const bool rerounded = p.drops(Recompute::moe_out);
    const double tol = !rerounded ? 1e-6 : prec.compute == DType::f32 ? 1e-5 : 2e-2;
    for (size_t i = 0; i < r.grads.size(); ++i) {
      EXPECT_TRUE(test::normalized_close(r.grads[i], base.grads[i], tol)) << "gradient " << i;
    }
    if (p.segment > 0) {
      // Every MoE layer outside the last segment recomputed and checked its
      // routing once per micro-batch (2 micro-batches).
      int64_t expected = 0;
      const int64_t last = (small_model().n_layers - 1) / p.segment * p.segment;
      for (int64_t i = 0; i < last; ++i) expected += layer_is_moe(moe, i) ? 2 : 0;
      EXPECT_GT(expected, 0);
      EXPECT_EQ(r.routing_checks, expected);
    } else {
      EXPECT_EQ(r.routing_checks, 0);
    }
    EXPECT_LT(r.activation_peak, base.activation_peak) << "the policy dropped nothing";
    std::printf("%-40s activation peak %8lld bytes (none %lld)\n", describe(p).c_str(),
                static_cast<long long>(r.activation_peak),
                static_cast<long long>(base.activation_peak));
  }
}

TEST(Recompute, EveryPolicyGivesTheGradientsOfNoneFp32) {
  expect_same_as_none(Precision::fp32(), small_moe());
}

TEST(Recompute, EveryPolicyGivesTheGradientsOfNoneWithCapacityDropsAndSigmoidRouter) {
  MoeConfig e = small_moe();
  e.capacity_factor = 1.0;  // some slots dropped: the plan must be rebuilt the same way
  e.router_score = "sigmoid";
  e.bias_update_rate = 1e-3;  // selection bias in use
  expect_same_as_none(Precision::fp32(), e);
}

TEST(Recompute, EveryPolicyGivesTheGradientsOfNoneBf16) {
  // bf16 activations: the router's fp32 input copy is a separate buffer here
  // (moe_dispatch drops and rebuilds it).
  expect_same_as_none(Precision::bf16(), small_moe());
}

TEST(Recompute, SelectiveAndFullDropInTheExpectedOrder) {
  const int64_t l = small_model().n_layers;
  const int64_t none = run(RecomputePolicy{}, Precision::fp32(), small_moe(), 1).activation_peak;
  const int64_t selective =
      run(make_recompute_policy("selective", {}, l), Precision::fp32(), small_moe(), 1)
          .activation_peak;
  const int64_t full =
      run(make_recompute_policy("full", {}, l), Precision::fp32(), small_moe(), 1).activation_peak;
  EXPECT_LT(selective, none);
  EXPECT_LT(full, selective);
}

TEST(Recompute, PolicyErrorsNameTheKey) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { make_recompute_policy("most", {}, 4); }).find("recompute.policy"),
            std::string::npos);
  EXPECT_NE(message([] { make_recompute_policy("custom", {}, 4); }).find("recompute.modules"),
            std::string::npos);
  EXPECT_NE(
      message([] { make_recompute_policy("custom", {"mlp"}, 4); }).find("unknown module \"mlp\""),
      std::string::npos);
  EXPECT_NE(message([] { make_recompute_policy("full", {"norm"}, 4); }).find("recompute.modules"),
            std::string::npos);
  EXPECT_NE(message([] { make_recompute_policy("full", {}, 4, 2); }).find("recompute.segment"),
            std::string::npos);
  EXPECT_EQ(make_recompute_policy("sqrt", {}, 16).segment, 4);
  EXPECT_EQ(make_recompute_policy("sqrt", {}, 17).segment, 5);
  EXPECT_EQ(make_recompute_policy("full", {}, 3).segment, 1);
  // moe_act, norm, moe_dispatch, moe_out, attn_q, attn_kv.
  EXPECT_EQ(make_recompute_policy("selective", {}, 3).modules, 0x7eu);
}

}  // namespace
}  // namespace moetron::nn
