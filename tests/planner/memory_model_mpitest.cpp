// The memory model against the allocator on parallel layouts (2 and 4 ranks
// under mpirun): every rank trains one step of the layout and compares its
// own allocator peaks with the model's prediction for its place in the
// layout (its dp/tp/ep shard and pipeline stage). Parameters and gradients
// must be exact, the optimizer state exact (ZeRO-1: within 1%), and the
// activations, the communication buffers and the total peak within 10%
// (activations under uncapped ep: 20%, see below).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "moetron/planner/memory_model.h"
#include "moetron/train/memory_report.h"
#include "moetron/train/trainer.h"
#include "util/layout_runs.h"
#include "util/mpi_test_main.h"

namespace moetron::planner {
namespace {

comm::Communicator& world() {
  return test::mpi_world();
}
const std::string& job_dir() {
  return test::layout_job_dir("moetron_mem_");
}

struct Case {
  std::string name;
  std::vector<std::string> sets;
  int64_t dp;  // rows per micro-batch are 4 / dp per rank
};

std::vector<Case> cases() {
  const int64_t n = world().size();
  std::vector<Case> out;
  if (n == 2) {
    out.push_back({"dp2", {}, 2});
    out.push_back({"dp2 zero1", {"parallel.zero=true"}, 2});
    out.push_back({"dp2 int8 gradients", {"parallel.compression=int8"}, 2});
    out.push_back({"dp2 bf16 grads", {"train.precision=bf16", "train.grad_dtype=bf16"}, 2});
    out.push_back({"dp2 zero1 bf16 moments", {"parallel.zero=true", "optim.moment_dtype=bf16"}, 2});
    out.push_back({"tp2", {"parallel.tp=2"}, 1});
    out.push_back(
        {"tp2 sp selective",
         {"parallel.tp=2", "parallel.sequence_parallel=true", "recompute.policy=selective"},
         1});
    out.push_back({"ep2", {"parallel.ep=2"}, 2});
    out.push_back(
        {"ep2 zero1 muon", {"parallel.ep=2", "parallel.zero=true", "optim.name=muon"}, 2});
    out.push_back({"pp2 1f1b", {"parallel.pp=2"}, 1});
    out.push_back({"pp2 gpipe", {"parallel.pp=2", "parallel.schedule=gpipe"}, 1});
    out.push_back({"pp2 vpp2", {"parallel.pp=2", "parallel.vpp=2"}, 1});
    out.push_back({"pp2 full", {"parallel.pp=2", "recompute.policy=full"}, 1});
    // Context parallelism: the ring's K/V blocks, the whole sequence's K/V
    // per layer, the dK/dV sums and their reduce-scatter.
    out.push_back({"cp2", {"parallel.cp=2"}, 1});
    out.push_back({"cp2 full", {"parallel.cp=2", "recompute.policy=full"}, 1});
    out.push_back({"cp2 all_to_all", {"parallel.cp=2", "parallel.cp_comm=all_to_all"}, 1});
    out.push_back({"cp2 a2a selective",
                   {"parallel.cp=2", "parallel.cp_comm=all_to_all", "recompute.policy=selective"},
                   1});
    out.push_back(
        {"tp2 zero1 muon", {"parallel.tp=2", "parallel.zero=true", "optim.name=muon"}, 1});
    out.push_back({"pp2 zero1", {"parallel.pp=2", "parallel.zero=true"}, 1});
  } else {
    out.push_back({"dp2 tp2 sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}, 2});
    out.push_back({"ep4", {"parallel.ep=4"}, 4});
    out.push_back({"ep2 dp4 bf16 grads+moments",
                   {"parallel.ep=2", "train.precision=bf16", "train.grad_dtype=bf16",
                    "optim.moment_dtype=bf16"},
                   4});
    out.push_back({"ep2 dp4 capacity", {"parallel.ep=2", "moe.capacity_factor=1.25"}, 4});
    out.push_back({"pp2 ep2", {"parallel.pp=2", "parallel.ep=2"}, 2});
    out.push_back({"pp2 tp2 muon", {"parallel.pp=2", "parallel.tp=2", "optim.name=muon"}, 1});
    out.push_back({"pp4", {"parallel.pp=4"}, 1});
    out.push_back({"cp4", {"parallel.cp=4"}, 1});
    out.push_back(
        {"cp2 tp2 sp", {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}, 1});
    out.push_back({"cp2 pp2", {"parallel.cp=2", "parallel.pp=2"}, 1});
    out.push_back(
        {"dp2 tp2 zero1 muon", {"parallel.tp=2", "parallel.zero=true", "optim.name=muon"}, 2});
    out.push_back({"pp2 tp2 zero1 sp",
                   {"parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                    "parallel.zero=true"},
                   1});
    out.push_back({"tp 2x2", {"parallel.tp_2d=2x2"}, 1});
    out.push_back({"tp 2x2 full", {"parallel.tp_2d=2x2", "recompute.policy=full"}, 1});
    out.push_back({"pp2 dp2 sqrt gpipe",
                   {"parallel.pp=2", "recompute.policy=sqrt", "parallel.schedule=gpipe"},
                   2});
  }
  return out;
}

train::Config config_of(const Case& c) {
  std::vector<std::string> sets = {"data.path=" + job_dir() + "/prepared",
                                   "train.steps=1",
                                   "train.micro_batch=" + std::to_string(4 / c.dp),
                                   "train.grad_accum=4",
                                   "model.d_model=64",
                                   "model.ffn_hidden=96",
                                   "moe.expert_hidden=64",
                                   "train.seq_len=32",
                                   "model.max_seq_len=32",
                                   "parallel.bucket_mb=0.05",
                                   "train.threads=1",
                                   "train.eval_batches=1"};
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  return train::load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

double rel(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) /
         static_cast<double>(std::max<int64_t>(measured, 1));
}

TEST(MemoryModelLayouts, PredictsEachRanksPeakWithinTenPercent) {
  const int rank = world().rank();
  if (rank == 0) {
    std::printf("%-22s %4s %10s %10s %7s %10s %10s %7s %10s %10s %7s\n", "layout", "rank",
                "act pred", "act meas", "err", "comm pred", "comm meas", "err", "total pred",
                "total meas", "err");
  }
  const std::vector<Case> all = cases();
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    SCOPED_TRACE(c.name + ", rank " + std::to_string(rank));
    const train::Config cfg = config_of(c);
    Allocator& alloc = cpu_allocator();
    alloc.release_cached();
    const MemStats before = alloc.stats();
    MemStats got;
    {
      train::Trainer t(cfg, test::layout_run_dir(job_dir(), "mem-" + std::to_string(i), true),
                       false, world().split(0, rank));
      got = t.run().first_step_memory;
    }
    for (int tg = 0; tg < kNumMemTags; ++tg)
      got.peak[static_cast<size_t>(tg)] -= before.current[static_cast<size_t>(tg)];
    got.total_peak -= before.total_current;
    const MemoryInputs in = train::memory_inputs(cfg, train::resolve_precision(cfg.train, nullptr),
                                                 1, train::layout_of(cfg, world().size(), rank));
    const MemoryEstimate est = estimate_memory(in);
    const auto meas = [&](MemTag tg) { return got.peak[static_cast<size_t>(tg)]; };
    EXPECT_EQ(est.peak_of(MemTag::params), meas(MemTag::params));
    EXPECT_EQ(est.peak_of(MemTag::grads), meas(MemTag::grads));
    if (cfg.parallel.zero) {
      EXPECT_LE(std::abs(rel(est.peak_of(MemTag::optimizer), meas(MemTag::optimizer))), 0.01);
    } else {
      EXPECT_EQ(est.peak_of(MemTag::optimizer), meas(MemTag::optimizer));
    }
    // Under ep without a capacity factor the expert buffers follow the
    // router, which the model takes as balanced: a rank whose experts drew
    // more tokens holds more (13.6% more activations seen at ep 4 on this
    // tiny model); the total peak is held to 10% all the same.
    const bool routed = cfg.parallel.ep > 1 && cfg.moe.capacity_factor <= 0;
    EXPECT_LE(std::abs(rel(est.peak_of(MemTag::activations), meas(MemTag::activations))),
              routed ? 0.20 : 0.10);
    // The trainer's scalar all-reduces (loss sums, expert loads, grad norm:
    // a few 64-byte blocks) are not modelled: 1 KiB of slack.
    EXPECT_LE(std::abs(est.peak_of(MemTag::comm) - meas(MemTag::comm)),
              std::max<int64_t>(1024, meas(MemTag::comm) / 10));
    EXPECT_LE(std::abs(rel(est.total_peak, got.total_peak)), 0.10);
    for (int r = 0; r < world().size(); ++r) {
      if (r == rank) {
        std::printf(
            "%-22s %4d %10lld %10lld %+6.1f%% %10lld %10lld %+6.1f%% %10lld %10lld %+6.1f%%\n",
            c.name.c_str(), rank, static_cast<long long>(est.peak_of(MemTag::activations)),
            static_cast<long long>(meas(MemTag::activations)),
            100 * rel(est.peak_of(MemTag::activations), meas(MemTag::activations)),
            static_cast<long long>(est.peak_of(MemTag::comm)),
            static_cast<long long>(meas(MemTag::comm)),
            100 * rel(est.peak_of(MemTag::comm), meas(MemTag::comm)),
            static_cast<long long>(est.total_peak), static_cast<long long>(got.total_peak),
            100 * rel(est.total_peak, got.total_peak));
        std::fflush(stdout);
      }
      world().barrier();
    }
  }
}

}  // namespace
}  // namespace moetron::planner
