// The TrainingPlan against the running ranks (2, 4 and 8 ranks under
// mpirun): for layouts of the layout tests, every rank builds its Trainer
// and checks that its communicators hold exactly the plan's groups (in the
// plan's order), and that `moetron train --dry-run -n N`, run in one process
// without MPI, prints the coordinates, reducers, buckets (element counts
// and parameters) and memory prediction each rank uses and prints.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moetron/core/threading.h"
#include "moetron/train/memory_report.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::train {
namespace {

comm::Communicator& world() {
  return test::mpi_world();
}
const std::string& job_dir() {
  return test::layout_job_dir("moetron_plan_");
}

struct Layout {
  std::string name;
  int64_t rows;  // per dp rank per micro-batch
  std::vector<std::string> sets;
};

std::vector<Layout> layouts() {
  switch (world().size()) {
    case 2:
      return {{"dp2-zero-muon", 2, {"parallel.zero=true", "optim.name=muon"}},
              {"pp2", 4, {"parallel.pp=2"}},
              {"tp2-sp", 4, {"parallel.tp=2", "parallel.sequence_parallel=true"}}};
    case 4:
      return {{"tp2-dp2-ep2-zero", 2, {"parallel.tp=2", "parallel.ep=2", "parallel.zero=true"}},
              {"pp2-dp2-ep2", 2, {"parallel.pp=2", "parallel.ep=2"}}};
    default:
      return {{"pp2-tp2-dp2-ep2-zero-muon",
               2,
               {"parallel.pp=2", "parallel.tp=2", "parallel.ep=2", "parallel.zero=true",
                "optim.name=muon"}},
              {"tp2-sp-dp4-ep4",
               1,
               {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=4"}},
              {"pp2-vpp2-dp4-int8",
               1,
               {"parallel.pp=2", "parallel.vpp=2", "parallel.compression=int8",
                "parallel.microbatches=2"}}};
  }
}

// Every rank's world rank over `c`, in c's rank order.
std::vector<int> members(comm::Communicator& c) {
  Tensor mine = Tensor::empty({1}, DType::i32, MemTag::comm);
  mine.data<int32_t>()[0] = world().rank();
  Tensor all = Tensor::empty({c.size()}, DType::i32, MemTag::comm);
  c.allgather(mine, all);
  return std::vector<int>(all.data<int32_t>(), all.data<int32_t>() + c.size());
}

// Rank 0 runs the binary's dry run for the whole job; every rank reads it.
nlohmann::json dry_run(const Config& cfg, const std::string& name) {
  const std::string base = job_dir() + "/" + name;
  if (world().rank() == 0) {
    std::ofstream(base + ".toml") << to_toml(cfg);
    // A clean environment: the dry run is one process, outside the MPI job.
    const std::string cmd = "env -i OMP_NUM_THREADS=1 " MOETRON_BINARY " plan --config " + base +
                            ".toml -n " + std::to_string(world().size()) + " --json " + base +
                            ".json > " + base + ".out 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  world().barrier();
  std::ifstream f(base + ".json");
  EXPECT_TRUE(f.good()) << base << ".json";
  return f.good() ? nlohmann::json::parse(f) : nlohmann::json();
}

void expect_groups_match(Trainer& t) {
  const parallel::TrainingPlan& plan = t.plan();
  const int me = world().rank();
  for (parallel::Group g :
       {parallel::Group::tp, parallel::Group::pp, parallel::Group::stage, parallel::Group::ep}) {
    comm::Communicator* c = t.group_comm(g);
    ASSERT_EQ(c != nullptr, plan.has_group(g)) << parallel::name_of(g);
    if (c) {
      EXPECT_EQ(members(*c), plan.group(g, me)) << parallel::name_of(g);
    }
  }
  for (const parallel::ReducerPlan& r : t.rank_plan().reducers) {
    parallel::GradReducer* red = t.reducer_for(r.carries);
    ASSERT_NE(red, nullptr) << parallel::name_of(r.carries);
    EXPECT_EQ(members(red->comm()), plan.group(r.over, me)) << parallel::name_of(r.carries);
  }
}

void expect_rank_matches(Trainer& t, const nlohmann::json& plan_rank) {
  const parallel::RankCoords& c = t.rank_plan().coords;
  const nlohmann::json& jc = plan_rank["coords"];
  EXPECT_EQ(jc["pp"], c.pp);
  EXPECT_EQ(jc["dp"], c.dp);
  EXPECT_EQ(jc["tp"], c.tp);
  EXPECT_EQ(jc["ep"], c.ep);
  EXPECT_EQ(jc["edp"], c.edp);
  const nlohmann::json& reducers = plan_rank["reducers"];
  ASSERT_EQ(reducers.size(), t.rank_plan().reducers.size());
  for (size_t i = 0; i < reducers.size(); ++i) {
    parallel::GradReducer* red = t.reducer_for(t.rank_plan().reducers[i].carries);
    ASSERT_NE(red, nullptr);
    ASSERT_EQ(reducers[i]["buckets"].size(), red->buckets().size());
    EXPECT_EQ(reducers[i]["size"], red->comm().size());
    for (size_t b = 0; b < red->buckets().size(); ++b) {
      const auto& got = red->buckets()[b];
      const nlohmann::json& want = reducers[i]["buckets"][b];
      EXPECT_EQ(want["elements"], got.numel);
      ASSERT_EQ(want["parameters"].size(), got.slots.size());
      for (size_t k = 0; k < got.slots.size(); ++k)
        EXPECT_EQ(want["parameters"][k], got.slots[k].param->name);
    }
  }
  // The prediction this rank's report prints (train/memory_report.h) is the dry run's.
  const planner::MemoryEstimate est = planner::estimate_memory(
      memory_inputs(t.config(), t.plan(), world().rank(), num_compute_threads()));
  EXPECT_EQ(plan_rank["memory"]["total_peak"], est.total_peak);
  for (int tag = 0; tag < kNumMemTags; ++tag) {
    EXPECT_EQ(plan_rank["memory"][std::string(mem_tag_name(static_cast<MemTag>(tag)))],
              est.peak[static_cast<size_t>(tag)])
        << mem_tag_name(static_cast<MemTag>(tag));
  }
}

TEST(TrainingPlanRanks, CommunicatorsBucketsAndMemoryAreThePlans) {
  for (const Layout& l : layouts()) {
    SCOPED_TRACE(l.name + " on rank " + std::to_string(world().rank()));
    const Config cfg = test::layout_config(job_dir(), l.rows, 2, l.sets);
    const nlohmann::json plan = dry_run(cfg, l.name);
    ASSERT_TRUE(plan.contains("ranks"));
    Trainer t(cfg, test::layout_run_dir(job_dir(), l.name), false, test::shared_world());
    EXPECT_EQ(plan["layout"]["dp"], t.plan().dp());
    expect_groups_match(t);
    expect_rank_matches(t, plan["ranks"][static_cast<size_t>(world().rank())]);
  }
}

}  // namespace
}  // namespace moetron::train
