// The TrainingPlan in one process: rank coordinates and groups on the
// process mesh, the stage split, which reducer carries each gradient, its
// buckets against those planned over a built model, and the errors that
// name the rule a layout breaks.
#include "moetron/parallel/training_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "moetron/core/error.h"
#include "moetron/nn/transformer.h"
#include "util/test_util.h"

namespace moetron::parallel {
namespace {

PlanSettings tiny(int64_t tp, int64_t ep, int64_t pp) {
  PlanSettings s;
  s.model.vocab_size = 64;
  s.model.d_model = 16;
  s.model.n_layers = 4;
  s.model.n_heads = 4;
  s.model.n_kv_heads = 2;
  s.model.ffn_hidden = 24;
  s.model.max_seq_len = 16;
  s.moe.num_experts = 4;
  s.moe.top_k = 2;
  s.moe.expert_hidden = 12;
  s.moe.first_dense_layers = 1;
  s.moe.shared_experts = 1;
  s.tp = tp;
  s.ep = ep;
  s.pp = pp;
  s.micro_batch = 2;
  s.seq_len = 8;
  s.grad_accum = 2;  // 1F1B needs at least pp micro-batches
  s.reducer.bucket_bytes = 4096;
  return s;
}

using test::error_of;

TEST(TrainingPlan, CoordinatesAndGroupsFollowTheMesh) {
  const TrainingPlan plan(tiny(2, 2, 2), 8);  // pp 2 x dp 2 x tp 2, ep 2 folded into each stage
  EXPECT_EQ(plan.dp(), 2);
  EXPECT_EQ(plan.stage_size(), 4);
  const RankCoords c = plan.coords(5);
  EXPECT_EQ(c, (RankCoords{5, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(plan.group(Group::tp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(plan.group(Group::dp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(plan.group(Group::pp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(plan.group(Group::stage, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(plan.group(Group::ep, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(plan.group(Group::expert_dp, 5), (std::vector<int>{5, 7}));
  // Every rank sits at its own coordinates; a group's members agree on it.
  std::map<std::tuple<int, int, int>, int> seen;
  for (int r = 0; r < 8; ++r) {
    const RankCoords rc = plan.coords(r);
    EXPECT_TRUE(seen.emplace(std::make_tuple(rc.pp, rc.dp, rc.tp), r).second);
    for (Group g : {Group::tp, Group::dp, Group::pp, Group::stage, Group::ep, Group::expert_dp}) {
      for (int m : plan.group(g, r)) EXPECT_EQ(plan.group(g, m), plan.group(g, r));
    }
  }
}

// cp sits between tp and dp: the cp ranks of a replica split its sequences,
// the dense gradients reduce over dp x cp, the experts' over every rank
// holding them (cp folded into expert-dp).
TEST(TrainingPlan, ContextParallelRanksSitBetweenTpAndDp) {
  PlanSettings s = tiny(2, 2, 1);
  s.cp = 2;
  const TrainingPlan plan(s, 8);  // tp 2 x cp 2 x dp 2
  EXPECT_EQ(plan.dp(), 2);
  EXPECT_EQ(plan.replicas(), 4);
  EXPECT_EQ(plan.coords(5), (RankCoords{5, 0, 1, 1, 0, 1, 2, 5}));
  EXPECT_EQ(plan.group(Group::cp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(plan.group(Group::tp, 5), (std::vector<int>{4, 5}));
  std::vector<int> dense = plan.group(Group::dp, 5);
  std::sort(dense.begin(), dense.end());
  EXPECT_EQ(dense, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(plan.group(Group::stage, 5).size(), 8u);
  EXPECT_EQ(plan.group(Group::ep, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(plan.group(Group::expert_dp, 5), (std::vector<int>{1, 3, 5, 7}));
  const RankPlan rp = plan.rank_plan(5);
  ASSERT_NE(rp.reducer(GradGroup::dense), nullptr);
  EXPECT_EQ(rp.reducer(GradGroup::dense)->size, 4);
  EXPECT_EQ(rp.reducer(GradGroup::partial)->size, 8);
  EXPECT_EQ(rp.reducer(GradGroup::expert)->size, 4);
  EXPECT_NE(error_of([&] { TrainingPlan(s, 6); }).find("parallel.tp * parallel.cp = 2 * 2"),
            std::string::npos);
}

TEST(TrainingPlan, StagesHoldEveryLayerOnceWithEmbeddingFirstAndHeadLast) {
  const TrainingPlan plan(tiny(1, 1, 2), 2);
  ASSERT_EQ(plan.stages().size(), 2u);
  EXPECT_EQ(plan.stages().front().first, 0);
  EXPECT_EQ(plan.stages().back().second, 4);
  EXPECT_EQ(plan.stages()[0].second, plan.stages()[1].first);
  EXPECT_TRUE(plan.place(0).embedding && !plan.place(0).head);
  EXPECT_TRUE(!plan.place(1).embedding && plan.place(1).head);
  PlanSettings v = tiny(1, 1, 2);
  v.vpp = 2;
  v.grad_accum = 2;
  const TrainingPlan inter(v, 2);
  EXPECT_EQ(inter.chunks(1), (std::vector<LayerRange>{{1, 2}, {3, 4}}));
  // A measured split is taken as given.
  const TrainingPlan measured(tiny(1, 1, 2), 2, {{0, 3}, {3, 4}});
  EXPECT_EQ(measured.chunks(0), (std::vector<LayerRange>{{0, 3}}));
}

TEST(TrainingPlan, EachGradientHasOneReducerChosenByItsKind) {
  PlanSettings s = tiny(2, 2, 1);
  s.zero = true;
  s.optimizer = OptimizerKind::muon;
  const TrainingPlan plan(s, 8);  // dp 4 x tp 2, ep 2: experts replicated over 4 ranks
  const RankPlan rp = plan.rank_plan(3);
  ASSERT_EQ(rp.reducers.size(), 3u);
  const ReducerPlan* expert = rp.reducer(GradGroup::expert);
  const ReducerPlan* partial = rp.reducer(GradGroup::partial);
  const ReducerPlan* dense = rp.reducer(GradGroup::dense);
  ASSERT_TRUE(expert && partial && dense);
  EXPECT_EQ(expert->size, 4);
  EXPECT_EQ(expert->options.mode, ReduceMode::allreduce);  // whole experts are not ZeRO-sharded
  EXPECT_EQ(partial->size, 8);
  EXPECT_EQ(dense->size, 4);
  EXPECT_EQ(dense->options.mode, ReduceMode::reduce_scatter);
  std::vector<int> carried(rp.inventory.params.size(), 0);
  for (const ReducerPlan& r : rp.reducers) {
    for (const PlannedBucket& b : r.buckets) {
      EXPECT_EQ(b.numel % r.size, 0);
      for (const PlannedSlot& sl : b.slots) {
        ++carried[sl.param];
        const nn::ParamInfo& p = rp.inventory.params[sl.param];
        EXPECT_EQ(plan.grad_group(p), r.carries) << p.name;
        if (r.carries == GradGroup::expert) {
          EXPECT_EQ(p.kind, nn::ParallelKind::expert);
        }
        // FlexMuon: Muon's matrices belong wholly to one owner's chunk.
        if (plan.uses_muon(p) && r.carries != GradGroup::expert) {
          EXPECT_GE(sl.owner, 0) << p.name;
          EXPECT_EQ(sl.offset / (b.numel / r.size), (sl.offset + sl.numel - 1) / (b.numel / r.size))
              << p.name;
        }
      }
    }
  }
  for (size_t i = 0; i < carried.size(); ++i)
    EXPECT_EQ(carried[i], 1) << rp.inventory.params[i].name;
}

TEST(TrainingPlan, BucketsEqualThosePlannedOverTheBuiltModel) {
  PlanSettings s = tiny(2, 2, 2);
  const TrainingPlan plan(s, 8);
  for (int rank : {0, 5, 6}) {
    const RankPlan rp = plan.rank_plan(rank);
    nn::TensorParallel tp{s.tp, rp.coords.tp, false, nullptr, nullptr};
    nn::Transformer model(s.model, s.moe, s.precision, {s.ep, rp.coords.ep}, tp, rp.place);
    const std::vector<nn::ParamInfo> desc = nn::describe_parameters(model.params());
    std::map<const nn::Parameter*, size_t> index;
    for (size_t i = 0; i < desc.size(); ++i) index[model.params().all()[i].get()] = i;
    for (const ReducerPlan& r : rp.reducers) {
      const auto carries = [&](const nn::Parameter& p) {
        return plan.grad_group(desc[index.at(&p)]) == r.carries;
      };
      const std::vector<BucketSpec> built =
          flat_bucket_plan(model.params(), r.size, r.options.bucket_bytes, carries);
      const std::vector<BucketSpec> planned = bind_buckets(r.buckets, model.params());
      ASSERT_EQ(built.size(), planned.size()) << "rank " << rank << " " << name_of(r.carries);
      for (size_t b = 0; b < built.size(); ++b) {
        EXPECT_EQ(built[b].numel, planned[b].numel);
        ASSERT_EQ(built[b].slots.size(), planned[b].slots.size());
        for (size_t k = 0; k < built[b].slots.size(); ++k) {
          EXPECT_EQ(built[b].slots[k].param, planned[b].slots[k].param);
          EXPECT_EQ(built[b].slots[k].offset, planned[b].slots[k].offset);
        }
      }
    }
  }
}

TEST(TrainingPlan, LayoutErrorsNameTheKey) {
  EXPECT_NE(error_of([] {
              TrainingPlan(tiny(1, 1, 4), 6);
            }).find("parallel.pp = 4 does not divide the 6 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              TrainingPlan(tiny(4, 1, 1), 2);
            }).find("parallel.tp = 4 does not divide the 2 ranks"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { TrainingPlan(tiny(1, 4, 1), 6); }).find("parallel.ep = 4 does not divide"),
      std::string::npos);
  PlanSettings g = tiny(1, 1, 1);
  g.global_batch = 6;
  g.micro_batch = 4;
  EXPECT_NE(error_of([&] { TrainingPlan(g, 1); }).find("train.global_batch = 6 is not a multiple"),
            std::string::npos);
  PlanSettings c = tiny(1, 1, 1);
  c.cp = 3;
  EXPECT_NE(error_of([&] { TrainingPlan(c, 2); }).find("parallel.tp * parallel.cp = 1 * 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_optimizer("sgd"); }).find("'optim.name'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_schedule("zb"); }).find("'parallel.schedule'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_muon_distribution("all"); }).find("'optim.muon_distribution'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_storage_dtype("fp16", "optim.moment_dtype");
            }).find("'optim.moment_dtype'"),
            std::string::npos);
}

}  // namespace
}  // namespace moetron::parallel
