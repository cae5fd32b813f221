// Measured pipeline stage costs: every layer gets its kind's probe time,
// the head's and embedding's costs are what they add to a layer, and a
// model whose head dwarfs its layers is split so the head's stage holds fewer layers.
#include "moetron/train/stage_costs.h"

#include <gtest/gtest.h>

#include "moetron/nn/model_config.h"
#include "moetron/train/config.h"

namespace moetron::train {
namespace {

Config tiny(const std::vector<std::string>& sets) {
  return load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

TEST(StageCosts, EachLayerCostsWhatItsKindMeasured) {
  const Config cfg = tiny({"model.n_layers=6", "train.threads=1"});
  auto world = comm::make_local_communicator();
  const MeasuredStageCosts m = measure_stage_costs(cfg, nn::Precision::fp32(), *world, 1);
  ASSERT_EQ(m.costs.layers.size(), 6u);
  EXPECT_GT(m.dense_layer, 0.0);  // tiny keeps its first layer dense
  EXPECT_GT(m.moe_layer, 0.0);
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(m.costs.layers[static_cast<size_t>(i)],
              nn::layer_is_moe(cfg.moe, i) ? m.moe_layer : m.dense_layer);
  }
  // (The embedding's and head's costs are differences clamped at 0: the
  // next test checks the head's is where it must be large.)
  const std::string line = describe_stages(parallel::balanced_stages(m.costs, 2), &m);
  EXPECT_NE(line.find("measured costs"), std::string::npos) << line;
  EXPECT_NE(line.find("dense layer"), std::string::npos) << line;
}

TEST(StageCosts, AHeavyHeadLeavesItsStageFewerLayers) {
  // A 32768-token vocabulary over d 32: the head's GEMMs and softmax are
  // ~30x a layer's work (measured 8x a layer's time here), so the last
  // stage keeps one layer.
  const Config cfg = tiny({"model.vocab_size=32768", "model.n_layers=4", "train.threads=1"});
  auto world = comm::make_local_communicator();
  // The median of 5 timings per probe: one timing could catch a neighbour
  // test's burst under ctest -j (this test flipped once in 6 full runs).
  const MeasuredStageCosts m = measure_stage_costs(cfg, nn::Precision::fp32(), *world, 5);
  EXPECT_GT(m.costs.head, 2.0 * std::max(m.dense_layer, m.moe_layer))
      << "head " << m.costs.head << " s, dense layer " << m.dense_layer << " s, MoE layer "
      << m.moe_layer << " s";
  const auto stages = parallel::balanced_stages(m.costs, 2);
  EXPECT_EQ(stages.back(), std::make_pair(int64_t{3}, int64_t{4}));
}

}  // namespace
}  // namespace moetron::train
