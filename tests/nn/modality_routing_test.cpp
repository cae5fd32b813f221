// Modality-aware MoE routing (nn/modality_routing.h): shared ignores the
// modality, prior at zero equals shared, partitioned keeps every token on
// its allowed experts, the new losses and prior's parameters against finite
// differences, per-modality loads, and the adaptive allocation rule.
#include "moetron/nn/modality_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "moetron/nn/moe.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

constexpr int64_t kTokens = 11, kWidth = 6, kExperts = 6;
const std::string kPrefix = "model.layers.0.";

ModelConfig tiny_model() {
  ModelConfig m;
  m.d_model = kWidth;
  m.n_layers = 2;
  m.init_std = 0.5;  // spread router logits: no near-ties for finite differences to flip
  return m;
}

MoeConfig tiny_moe(const std::string& routing) {
  MoeConfig e;
  e.num_experts = kExperts;
  e.top_k = 2;
  e.expert_hidden = 5;
  e.aux_loss_coef = 0.05;
  e.z_loss_coef = 0.01;
  e.modality_routing = routing;
  if (routing == "partitioned") e.modality_experts = "2,1,1";  // experts 4, 5 shared
  return e;
}

Tensor modalities(const std::vector<int32_t>& ids) {
  Tensor t = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

Tensor mixed_modalities() {
  return modalities({0, 1, 2, 0, 0, 1, 2, 2, 0, 1, 0});
}

MoeConfig with_entropy_cfg(const std::string& routing) {
  MoeConfig cfg = tiny_moe(routing);
  cfg.modality_local_entropy_coef = 0.3;
  cfg.modality_global_entropy_coef = 0.7;
  cfg.modality_global_entropy_threshold = 5.0;  // above log(6): the hinge is active
  return cfg;
}

struct Layer {
  ParameterSet params;
  std::unique_ptr<MoeLayer> moe;
  Layer(const MoeConfig& cfg, Precision prec = Precision::fp64()) {
    moe = std::make_unique<MoeLayer>(tiny_model(), cfg, kPrefix, prec, params);
    params.initialize(17);
  }
};

// Prior's parameters away from their zero start.
void randomize_prior(Layer& l) {
  for (const char* name : {"modality_embed", "modality_bias"}) {
    Parameter& p = l.params.get(kPrefix + "block_sparse_moe.gate." + name);
    p.value.copy_from(test::random_tensor(p.value.shape(), p.value.dtype(), name, -0.7f, 0.7f));
  }
}

struct Result {
  Tensor y, dx;
  MoeStats stats;
};

// Forward and backward of dy = probe on x.
Result run(kernels::Context& ctx, Layer& l, const Tensor& x, const Tensor& modality) {
  Result r;
  l.params.zero_grads();
  l.moe->set_token_modality(modality);
  r.y = Tensor::empty(x.shape(), x.dtype());
  r.stats = l.moe->forward(ctx, x, r.y, 1.0);
  Tensor probe = test::random_tensor(x.shape(), x.dtype(), "probe");
  r.dx = Tensor::empty(x.shape(), x.dtype());
  l.moe->backward(ctx, probe, r.dx);
  return r;
}

// sum(y * probe) + the balancing and entropy losses.
double objective(kernels::Context& ctx, Layer& l, const Tensor& x, const Tensor& modality) {
  l.moe->set_token_modality(modality);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const MoeStats st = l.moe->forward(ctx, x, y, 1.0);
  l.moe->release();
  l.moe->reset_load();
  Tensor probe = test::random_tensor(x.shape(), x.dtype(), "probe");
  double j = st.aux_loss + st.z_loss + st.entropy_loss;
  for (int64_t i = 0; i < y.numel(); ++i) j += y.data<double>()[i] * probe.data<double>()[i];
  return j;
}

void expect_identical(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_EQ(test::element(a, i), test::element(b, i)) << what << " element " << i;
  }
}

TEST(ModalityRouting, SharedIgnoresTheModality) {
  kernels::Context cpu(kernels::Backend::cpu);
  Layer a(tiny_moe("shared"), Precision::fp32()), b(tiny_moe("shared"), Precision::fp32());
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f32, "x");
  Result ra = run(cpu, a, x, Tensor()), rb = run(cpu, b, x, mixed_modalities());
  expect_identical(ra.y, rb.y, "y");
  expect_identical(ra.dx, rb.dx, "dx");
  EXPECT_EQ(ra.stats.aux_loss, rb.stats.aux_loss);
  EXPECT_EQ(ra.stats.z_loss, rb.stats.z_loss);
  for (const auto& p : a.params.all()) {
    expect_identical(p->grad, b.params.get(p->name).grad, p->name.c_str());
  }
  EXPECT_EQ(a.params.all().size(), b.params.all().size());
  EXPECT_EQ(a.moe->expert_load(), b.moe->expert_load());
}

TEST(ModalityRouting, PriorAtZeroEqualsShared) {
  kernels::Context cpu(kernels::Backend::cpu);
  MoeConfig prior_cfg = tiny_moe("prior"), shared_cfg = tiny_moe("shared");
  prior_cfg.aux_loss_coef = shared_cfg.aux_loss_coef = 0;  // the per-modality Switch loss differs
  Layer shared(shared_cfg, Precision::fp32()), prior(prior_cfg, Precision::fp32());
  ASSERT_NE(prior.params.find(kPrefix + "block_sparse_moe.gate.modality_embed"), nullptr);
  ASSERT_NE(prior.params.find(kPrefix + "block_sparse_moe.gate.modality_bias"), nullptr);
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f32, "x");
  Result rs = run(cpu, shared, x, mixed_modalities()), rp = run(cpu, prior, x, mixed_modalities());
  expect_identical(rs.y, rp.y, "y");
  // dx: the router's input gradient is added after the fact instead of
  // accumulated by the GEMM, so the last bits may round differently.
  EXPECT_TRUE(test::all_close(rp.dx, rs.dx, {1e-6, 1e-7}));
  EXPECT_EQ(rs.stats.z_loss, rp.stats.z_loss);
  for (const auto& p : shared.params.all()) {
    expect_identical(p->grad, prior.params.get(p->name).grad, p->name.c_str());
  }
}

TEST(ModalityRouting, PriorAtZeroWithAuxEqualsSharedForOneModality) {
  // One modality: the per-modality Switch loss is the global one.
  kernels::Context ref(kernels::Backend::reference);
  Layer shared(tiny_moe("shared")), prior(tiny_moe("prior"));
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f64, "x");
  Result rs = run(ref, shared, x, Tensor()), rp = run(ref, prior, x, Tensor());
  EXPECT_NEAR(rs.stats.aux_loss, rp.stats.aux_loss, 1e-15);
  EXPECT_TRUE(test::all_close(rp.dx, rs.dx, {1e-12, 1e-14}));
}

TEST(ModalityRouting, RecomputeRebuildsThePriorRouterInput) {
  // Dropping the dispatch buffers (and with them prior's router input) and
  // the activations gives the same gradients: backward rebuilds them with the
  // saved token modality.
  kernels::Context cpu(kernels::Backend::cpu);
  for (const char* mode : {"prior", "partitioned"}) {
    Layer keep(with_entropy_cfg(mode), Precision::bf16()),
        drop(with_entropy_cfg(mode), Precision::bf16());
    drop.moe->set_recompute(true, true);
    if (std::string(mode) == "prior") {
      randomize_prior(keep);
      randomize_prior(drop);
    }
    Tensor x = test::random_tensor({kTokens, kWidth}, DType::bf16, "x");
    Result rk = run(cpu, keep, x, mixed_modalities()), rd = run(cpu, drop, x, mixed_modalities());
    expect_identical(rk.dx, rd.dx, "dx");
    for (const auto& p : keep.params.all()) {
      expect_identical(p->grad, drop.params.get(p->name).grad, p->name.c_str());
    }
  }
}

TEST(ModalityRouting, PartitionedRoutesOnlyToAllowedExperts) {
  kernels::Context cpu(kernels::Backend::cpu);
  MoeConfig cfg = tiny_moe("partitioned");
  cfg.bias_update_rate = 0.1;
  Layer l(cfg, Precision::fp32());
  // Large selection biases on every owned expert: a modality must still not
  // reach another modality's experts.
  for (int64_t j = 0; j < 4; ++j) l.moe->bias().data<float>()[j] = 50.0f;
  const std::vector<int32_t> owner = {0, 0, 1, 2, -1, -1};
  EXPECT_EQ(l.moe->expert_owners(), owner);
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f32, "x", -3, 3);
  run(cpu, l, x, mixed_modalities());
  const auto load = l.moe->expert_load_by_modality();
  ASSERT_EQ(load.size(), 3u);
  for (int32_t m = 0; m < 3; ++m) {
    for (int64_t j = 0; j < kExperts; ++j) {
      if (owner[static_cast<size_t>(j)] >= 0 && owner[static_cast<size_t>(j)] != m) {
        EXPECT_EQ(load[static_cast<size_t>(m)][static_cast<size_t>(j)], 0) << m << " " << j;
      }
    }
  }
  // The biased owned experts win within each modality's allowed set.
  EXPECT_GT(load[1][2], 0);
  EXPECT_GT(load[2][3], 0);
}

TEST(ModalityRouting, PerModalityLoadsAddUpToTheLoad) {
  kernels::Context cpu(kernels::Backend::cpu);
  for (const char* mode : {"shared", "prior", "partitioned"}) {
    Layer l(tiny_moe(mode), Precision::fp32());
    Tensor x = test::random_tensor({kTokens, kWidth}, DType::f32, "x");
    run(cpu, l, x, mixed_modalities());
    run(cpu, l, x, Tensor());  // unset: all modality 0
    const auto by = l.moe->expert_load_by_modality();
    int64_t total = 0;
    for (int64_t j = 0; j < kExperts; ++j) {
      int64_t sum = 0;
      for (const auto& row : by) sum += row[static_cast<size_t>(j)];
      EXPECT_EQ(sum, l.moe->expert_load()[static_cast<size_t>(j)]) << mode << " expert " << j;
      total += sum;
    }
    EXPECT_EQ(total, 2 * kTokens * 2) << mode;
    int64_t image = std::accumulate(by[1].begin(), by[1].end(), int64_t{0});
    EXPECT_EQ(image, 3 * 2) << mode;  // three image tokens, top-2
    l.moe->reset_load();
    EXPECT_EQ(l.moe->expert_load_by_modality()[0][0], 0);
  }
}

// Every gradient the layer writes (x and every parameter) against central
// differences of the objective, in f64 on the reference backend.
void check_gradients(const MoeConfig& cfg, bool random_prior) {
  kernels::Context ref(kernels::Backend::reference);
  Layer l(cfg);
  if (random_prior) randomize_prior(l);
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f64, "x");
  const Tensor mod = mixed_modalities();
  Result r = run(ref, l, x, mod);
  auto j = [&] { return objective(ref, l, x, mod); };
  EXPECT_TRUE(test::finite_difference_check(j, x, r.dx, 1e-6, 1e-6)) << cfg.modality_routing;
  for (const auto& p : l.params.all()) {
    Tensor grad = p->grad.clone();
    EXPECT_TRUE(test::finite_difference_check(j, p->value, grad, 1e-6, 1e-6))
        << cfg.modality_routing << " " << p->name;
  }
}

TEST(ModalityRouting, SharedEntropyLossesMatchFiniteDifferences) {
  check_gradients(with_entropy_cfg("shared"), false);
}

TEST(ModalityRouting, PriorMatchesFiniteDifferences) {
  check_gradients(with_entropy_cfg("prior"), true);
}

TEST(ModalityRouting, PartitionedMatchesFiniteDifferences) {
  check_gradients(with_entropy_cfg("partitioned"), false);
}

TEST(ModalityRouting, EntropyValues) {
  kernels::Context ref(kernels::Backend::reference);
  // Global hinge off (threshold 0): the entropy loss is local_coef * sum over
  // modalities of the mean token entropy, which lies in (0, log E_m].
  MoeConfig cfg = tiny_moe("partitioned");
  cfg.modality_local_entropy_coef = 1.0;
  Layer l(cfg);
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f64, "x");
  Result r = run(ref, l, x, mixed_modalities());
  EXPECT_GT(r.stats.entropy_loss, 0);
  EXPECT_LE(r.stats.entropy_loss, std::log(4.0) + 2 * std::log(3.0) + 1e-12);
  ModalitySums s;
  s.num_modalities = 1;
  s.num_experts = 2;
  s.tokens = {2};
  s.counts = {2, 2};
  s.score_sums = {1.5, 0.5};  // mean p = (0.75, 0.25)
  s.entropy_sums = {1.0};
  ModalityLossConfig c;
  c.aux_coef = 0.1;
  c.local_entropy_coef = 0.5;
  c.global_entropy_coef = 2.0;
  c.global_entropy_threshold = 1.0;
  const ModalityLossValues v = modality_loss_values(s, {-1, -1}, 2, c);
  const double h = -(0.75 * std::log(0.75) + 0.25 * std::log(0.25));
  EXPECT_NEAR(v.entropy, 0.5 * 0.5 + 2.0 * (1.0 - h), 1e-15);
  EXPECT_NEAR(v.aux, 0.1 * 2 * (0.5 * 0.75 + 0.5 * 0.25), 1e-15);
}

TEST(ModalityRouting, AdaptiveAllocationMovesTowardDemandAndSettles) {
  // Two modalities owning 4 experts each; modality 0 has 3x the tokens.
  std::vector<int32_t> owner = {0, 0, 0, 0, 1, 1, 1, 1};
  std::vector<double> load(16, 0.0);
  for (int j = 0; j < 8; ++j) {
    load[static_cast<size_t>(j)] = 30;
    load[static_cast<size_t>(8 + j)] = 10;
  }
  load[8 + 6] = 2;  // expert 6: modality 1's least loaded, given away first
  const AllocationRule rule{1, 0.1, 2};
  AllocationMove m = adapt_allocation(owner, load, {}, 2, rule);
  ASSERT_TRUE(m.moved);
  EXPECT_EQ(m.expert, 6);
  EXPECT_EQ(m.from, 1);
  EXPECT_EQ(m.to, 0);
  EXPECT_LT(m.phi_after * 1.1, m.phi_before + 1e-12);
  // Then 5/3 -> 6/2 (q equal); afterwards constant inputs never move again.
  std::vector<std::vector<int32_t>> history = {owner};
  for (int step = 0; step < 20; ++step) {
    adapt_allocation(owner, load, {}, 2, rule);
    history.push_back(owner);
  }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), 0), 6);
  for (size_t i = 2; i < history.size(); ++i) EXPECT_EQ(history[i], history[1]) << i;
  // Losses weigh demand: modality 1's 3x loss makes 4/4 nearly balanced (phi 1.11), and
  // moving one expert would leave phi 1.5: no move.
  std::vector<int32_t> even = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_FALSE(adapt_allocation(even, load, std::vector<double>{1.0, 3.0}, 2, rule).moved);
}

TEST(ModalityRouting, AdaptiveAllocationHysteresisAndMinimum) {
  // Equal demand on 3 vs 4 experts: moving one would only swap the imbalance.
  std::vector<int32_t> owner = {0, 0, 0, 1, 1, 1, 1};
  std::vector<double> load(14, 5.0);
  for (int step = 0; step < 5; ++step) {
    EXPECT_FALSE(adapt_allocation(owner, load, {}, 2, {1, 0.1, 1}).moved);
  }
  // All demand on modality 0: modality 1 gives experts down to the minimum.
  std::vector<double> skewed(14, 0.0);
  for (int j = 0; j < 7; ++j) skewed[static_cast<size_t>(j)] = 100;
  skewed[7] = 1;  // modality 1 has a trickle of tokens
  int moves = 0;
  for (int step = 0; step < 10; ++step)
    moves += adapt_allocation(owner, skewed, {}, 2, {2, 0.1, 1}).moved;
  EXPECT_EQ(moves, 2);
  EXPECT_EQ(std::count(owner.begin(), owner.end(), 1), 2);
}

TEST(ModalityRouting, LayerAllocationEveryNStepsAndState) {
  kernels::Context cpu(kernels::Backend::cpu);
  MoeConfig cfg = tiny_moe("partitioned");
  cfg.modality_experts = "1,2,1";
  cfg.modality_realloc_every = 2;
  cfg.modality_realloc_hysteresis = 0.0;
  Layer l(cfg, Precision::fp32());
  Tensor x = test::random_tensor({kTokens, kWidth}, DType::f32, "x");
  // Text-heavy batches: text (1 expert) should gain one from image (2 experts).
  const Tensor text_heavy = modalities({0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0});
  const std::vector<double> losses = {1.0, 1.0, 1.0};
  run(cpu, l, x, text_heavy);
  EXPECT_FALSE(l.moe->update_allocation(losses).moved);  // window of 1
  const std::vector<double> mid = l.moe->allocation_state();
  l.moe->reset_load();
  run(cpu, l, x, text_heavy);
  const std::vector<int64_t> second_load = l.moe->expert_load_by_modality_flat();
  const AllocationMove m = l.moe->update_allocation(losses);
  EXPECT_TRUE(m.moved);
  EXPECT_EQ(m.from, 1);
  EXPECT_EQ(m.to, 0);
  const std::vector<int32_t> after = l.moe->expert_owners();
  // A layer restored to the mid-window state makes the same move.
  Layer r(cfg, Precision::fp32());
  r.moe->set_allocation_state(mid);
  r.moe->set_expert_load_by_modality(second_load);
  EXPECT_TRUE(r.moe->update_allocation(losses).moved);
  EXPECT_EQ(r.moe->expert_owners(), after);
  EXPECT_EQ(r.moe->allocation_state(), l.moe->allocation_state());
}

TEST(ModalityRouting, BadSettingsNameTheKey) {
  auto msg = [](MoeConfig cfg) { return test::error_of([&] { Layer l(cfg); }); };
  MoeConfig c = tiny_moe("shared");
  c.modality_routing = "hashed";
  EXPECT_NE(msg(c).find("moe.modality_routing"), std::string::npos) << msg(c);
  c = tiny_moe("partitioned");
  c.modality_experts = "2,x,1";
  EXPECT_NE(msg(c).find("moe.modality_experts"), std::string::npos) << msg(c);
  c.modality_experts = "2,2";
  EXPECT_NE(msg(c).find("moe.modality_experts"), std::string::npos) << msg(c);
  c.modality_experts = "3,3,1";
  EXPECT_NE(msg(c).find("moe.modality_experts"), std::string::npos) << msg(c);
  c.modality_experts = "3,3,0";  // modality 2 keeps no expert and there are no shared ones
  EXPECT_NE(msg(c).find("moe.top_k"), std::string::npos) << msg(c);
  c = tiny_moe("shared");
  c.modality_experts = "2,2,2";
  EXPECT_NE(msg(c).find("moe.modality_experts"), std::string::npos) << msg(c);
  c = with_entropy_cfg("prior");
  c.router_score = "sigmoid";
  EXPECT_NE(msg(c).find("moe.router_score"), std::string::npos) << msg(c);
  c = tiny_moe("prior");
  c.modality_realloc_every = 5;
  EXPECT_NE(msg(c).find("moe.modality_realloc_every"), std::string::npos) << msg(c);
  kernels::Context cpu(kernels::Backend::cpu);
  Layer l(tiny_moe("prior"), Precision::fp32());
  Tensor x = test::random_tensor({3, kWidth}, DType::f32, "x");
  Tensor y = Tensor::empty({3, kWidth}, DType::f32);
  l.moe->set_token_modality(modalities({0, 3, 1}));
  EXPECT_NE(test::error_of([&] { l.moe->forward(cpu, x, y, 1.0); }).find("moe.num_modalities"),
            std::string::npos);
}

}  // namespace
}  // namespace moetron::nn
