// Modality-aware routing across ranks (nn/modality_routing.h): with the
// ranks splitting one micro-batch (balance group) and holding the experts
// (expert parallelism), every mode equals one rank holding every token:
// outputs, input gradients, the per-modality losses and every parameter
// gradient.
#include <gtest/gtest.h>

#include <memory>

#include "moetron/nn/moe.h"
#include "util/mpi_test_main.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

constexpr int64_t kPerRank = 5, kWidth = 6, kExperts = 8;
const std::string kPrefix = "model.layers.0.";

ModelConfig tiny_model() {
  ModelConfig m;
  m.d_model = kWidth;
  m.n_layers = 2;
  m.init_std = 0.5;
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
  e.modality_local_entropy_coef = 0.2;
  e.modality_global_entropy_coef = 0.4;
  e.modality_global_entropy_threshold = 5.0;
  if (routing == "partitioned") e.modality_experts = "3,2,1";  // experts 6, 7 shared
  return e;
}

struct Run {
  ParameterSet params;
  std::unique_ptr<MoeLayer> moe;
  Tensor y, dx;
  MoeStats stats;
};

// Tokens [first, first + count) of the global batch on a layer of `ep` ranks.
void run(Run& r, const MoeConfig& cfg, ExpertParallel ep, comm::Communicator* group, int64_t first,
         int64_t count, int64_t total) {
  kernels::Context cpu(kernels::Backend::cpu);
  r.moe = std::make_unique<MoeLayer>(tiny_model(), cfg, kPrefix, Precision::fp32(), r.params, ep);
  r.params.initialize(23);
  for (const auto& p : r.params.all()) {
    if (p->name.find("modality_") != std::string::npos) {
      p->value.copy_from(test::random_tensor(p->value.shape(), DType::f32, p->name, -0.5f, 0.5f));
    }
  }
  r.moe->set_balance_group(group);
  r.moe->set_expert_group(ep.size > 1 ? group : nullptr);
  const Tensor x_all = test::random_tensor({total, kWidth}, DType::f32, "x");
  const Tensor probe_all = test::random_tensor({total, kWidth}, DType::f32, "probe");
  Tensor mod = Tensor::empty({count}, DType::i32);
  for (int64_t i = 0; i < count; ++i)
    mod.data<int32_t>()[i] = static_cast<int32_t>((first + i) % 3);
  const Tensor x = x_all.slice(first, first + count).clone();
  const Tensor probe = probe_all.slice(first, first + count).clone();
  r.moe->set_token_modality(mod);
  r.y = Tensor::empty({count, kWidth}, DType::f32);
  r.stats = r.moe->forward(cpu, x, r.y, 1.0);
  r.dx = Tensor::empty({count, kWidth}, DType::f32);
  r.moe->backward(cpu, probe, r.dx);
}

void expect_matches_one_rank(const std::string& routing) {
  comm::Communicator& w = test::mpi_world();
  const int64_t n = w.size(), me = w.rank(), total = n * kPerRank;
  if (kExperts % n != 0) GTEST_SKIP() << kExperts << " experts over " << n << " ranks";
  const MoeConfig cfg = tiny_moe(routing);
  Run one, many;
  run(one, cfg, {}, nullptr, 0, total, total);
  run(many, cfg, {n, me}, &w, me * kPerRank, kPerRank, total);
  const test::Tolerance tol{1e-5, 1e-6};
  EXPECT_TRUE(test::all_close(many.y, one.y.slice(me * kPerRank, (me + 1) * kPerRank), tol))
      << routing;
  EXPECT_TRUE(test::all_close(many.dx, one.dx.slice(me * kPerRank, (me + 1) * kPerRank), tol))
      << routing;
  EXPECT_NEAR(many.stats.aux_loss, one.stats.aux_loss, 1e-6) << routing;
  EXPECT_NEAR(many.stats.entropy_loss, one.stats.entropy_loss, 1e-6) << routing;
  EXPECT_GT(one.stats.entropy_loss, 0) << routing;
  for (const auto& p : many.params.all()) {
    Tensor g = p->grad.clone();
    // Replicated parameters (router, prior) hold this rank's tokens' part.
    if (p->kind != ParallelKind::expert) w.allreduce(g, comm::ReduceOp::sum);
    EXPECT_TRUE(test::all_close(g, one.params.get(p->name).grad, tol)) << routing << " " << p->name;
  }
  // Loads: this rank's choices; summed over ranks they are the one rank's.
  std::vector<int64_t> load = many.moe->expert_load_by_modality_flat();
  Tensor sum = Tensor::empty({static_cast<int64_t>(load.size())}, DType::i64);
  std::copy(load.begin(), load.end(), sum.data<int64_t>());
  w.allreduce(sum, comm::ReduceOp::sum);
  EXPECT_EQ(std::vector<int64_t>(sum.data<int64_t>(), sum.data<int64_t>() + sum.numel()),
            one.moe->expert_load_by_modality_flat())
      << routing;
}

TEST(ModalityRoutingParallel, SharedEqualsOneRank) {
  expect_matches_one_rank("shared");
}
TEST(ModalityRoutingParallel, PriorEqualsOneRank) {
  expect_matches_one_rank("prior");
}
TEST(ModalityRoutingParallel, PartitionedEqualsOneRank) {
  expect_matches_one_rank("partitioned");
}

}  // namespace
}  // namespace moetron::nn
