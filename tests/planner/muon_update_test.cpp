// Muon's update under a layout, replicated vs FlexMuon's owners: Newton-
// Schulz FLOPs per matrix as the header says, one owner is the replicated
// cost with nothing gathered, and more owners split the work no finer than
// the largest matrix.
#include "moetron/planner/muon_update.h"

#include <gtest/gtest.h>

namespace moetron::planner {
namespace {

Workload one_dense_layer() {
  Workload w;
  w.model.vocab_size = 1000;
  w.model.d_model = 256;
  w.model.n_layers = 4;
  w.model.n_heads = 4;
  w.model.n_kv_heads = 2;
  w.model.ffn_hidden = 512;
  w.moe.num_experts = 0;
  w.seq_len = 128;
  w.global_batch = 16;
  return w;
}

HardwareProfile flat() {
  HardwareProfile hw;
  hw.peak_flops = 1e12;
  hw.gemm_efficiency = hw.grouped_gemm_efficiency = hw.attention_efficiency = 1;
  hw.gemm_half_rows = 1e-9;  // every GEMM at the full rate
  hw.memory_bytes = hw.host_memory_bytes = 1e12;
  hw.memory_bandwidth = hw.elementwise_bandwidth = hw.host_memory_bandwidth = 1e12;
  hw.pcie_bandwidth = 1e11;
  hw.devices_per_node = 8;
  hw.intra = {1e10, 1e-6};
  hw.inter = {1e9, 1e-5};
  return hw;
}

double ns(double a, double b) {  // a <= b, 5 steps at 1e12 FLOP/s
  return 5 * (4 * a * a * b + 2 * a * a * a) / 1e12;
}

TEST(MuonUpdate, ReplicatedIsNewtonSchulzOnEveryMatrixOfTheStage) {
  const CostModel m(one_dense_layer(), flat());
  LayoutChoice one;
  const MuonUpdate u = muon_update_seconds(m, one);
  // Per layer: q, o (256 x 256), k, v (256 x 128 -> a = 128), gate, up, down (256 x 512).
  const double layer = 2 * ns(256, 256) + 2 * ns(128, 256) + 3 * ns(256, 512);
  EXPECT_EQ(u.matrices, 4 * 7);
  EXPECT_NEAR(u.replicated_s, 4 * layer, 1e-12);
  EXPECT_NEAR(u.owner_compute_s, u.replicated_s, 1e-12);  // one owner does it all
  EXPECT_EQ(u.owner_gather_s, 0);
  // Two stages: half the layers each.
  LayoutChoice pp2;
  pp2.pp = 2;
  EXPECT_NEAR(muon_update_seconds(m, pp2).replicated_s, 2 * layer, 1e-12);
}

TEST(MuonUpdate, OwnersSplitTheWorkNoFinerThanTheLargestMatrix) {
  const CostModel m(one_dense_layer(), flat());
  LayoutChoice dp4;
  dp4.dp = 4;
  const MuonUpdate u = muon_update_seconds(m, dp4);
  EXPECT_GE(u.owner_compute_s, u.replicated_s / 4 - 1e-15);
  EXPECT_LE(u.owner_compute_s, u.replicated_s / 4 + ns(256, 512) + 1e-15);
  EXPECT_LT(u.owner_s(), u.replicated_s);
  // The gather: bf16 copies of the stage's 4 x (2 x 256^2 + 2 x 256 x 128 +
  // 3 x 256 x 512) parameters, half an all-reduce over 4 ranks on the node.
  const double params = 4 * (2 * 256.0 * 256 + 2 * 256.0 * 128 + 3 * 256.0 * 512);
  EXPECT_NEAR(u.owner_gather_s, 3 * 1e-6 + 0.75 * params * 2 / 1e10, 1e-12);
  // More owners (32) than matrices (28): the largest matrix bounds the update.
  LayoutChoice dp32 = dp4;
  dp32.dp = 32;
  EXPECT_NEAR(muon_update_seconds(m, dp32).owner_compute_s, ns(256, 512), 1e-9 * ns(256, 512));
}

}  // namespace
}  // namespace moetron::planner
