// Optimizer-step latency of distributed Muon on bench-moe's matrices (ZeRO-1,
// fp32, one thread per rank), per dp size (the mpirun world):
//   owner       FlexMuon: each matrix's Newton-Schulz on its owner only
//   gather      Moonlight's distributed Muon: ranks holding part of a matrix
//               gather its update and orthogonalise it
//   replicated  every rank gathers and orthogonalises every matrix
// Timed: the optimizer step (after the gradient reduce-scatter), the slowest
// rank's median over --reps steps.
//
//   mpirun -np 8 --oversubscribe build/bench/moetron_bench_flexmuon --layers 2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/zero_optimizer.h"
#include "moetron/parallel/grad_reducer.h"
#include "moetron/train/config.h"

using namespace moetron;
using clock_type = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int64_t layers = 2, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--layers")
      layers = std::stoll(argv[i + 1]);
    else if (a == "--reps")
      reps = std::stoll(argv[i + 1]);
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  auto world = comm::make_mpi_world();
  try {
    const train::Config cfg =
        train::load_config(MOETRON_SOURCE_DIR "/configs/bench-moe.toml",
                           {"model.n_layers=" + std::to_string(layers), "data.path=none"});
    kernels::Context ctx(kernels::Backend::cpu, 1);
    nlohmann::json out = nlohmann::json::array();
    for (const std::string mode : {"owner", "gather", "replicated"}) {
      nn::Transformer model(cfg.model, cfg.moe, nn::Precision::fp32());
      model.initialize(1);
      optim::OptimizerOptions oo;
      oo.name = "muon";
      oo.schedule = {1e-3, 0.1, 0, 100};
      parallel::ReducerOptions ro;
      ro.mode = parallel::ReduceMode::reduce_scatter;
      std::vector<parallel::BucketSpec> plan;
      if (mode == "owner") {
        plan = parallel::owner_bucket_plan(
            model.params(), world->size(), ro.bucket_bytes,
            [&oo](const nn::Parameter& p) { return optim::rule_uses_muon(oo, p); });
      }
      parallel::GradReducer reducer(model.params(), *world, ro, std::move(plan));
      optim::ZeroOptimizer opt(model.params(), oo, reducer, mode == "replicated");
      std::vector<double> times;
      for (int64_t r = 0; r <= reps; ++r) {
        for (const auto& p : model.params().all()) {
          Tensor g = p->grad;
          fill_normal(g, 100 + static_cast<uint64_t>(world->rank()), p->name, 0.0f, 1e-3f);
        }
        reducer.arm();
        const auto& all = model.params().all();
        for (size_t i = all.size(); i-- > 0;) reducer.grad_ready(ctx, *all[i]);
        reducer.finish(ctx);
        world->barrier();
        const auto t0 = clock_type::now();
        opt.step(ctx, r + 1, 1.0, -1);
        const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (r > 0) times.push_back(s);  // the first step allocates NS workspaces and primitives
      }
      std::sort(times.begin(), times.end());
      Tensor t = Tensor::empty({1}, DType::f64);
      t.data<double>()[0] = times[times.size() / 2];
      world->allreduce(t, comm::ReduceOp::max);
      int64_t matrices = 0;
      for (const auto& p : model.params().all()) matrices += optim::rule_uses_muon(oo, *p);
      out.push_back({{"dp", world->size()},
                     {"mode", mode},
                     {"step_s", t.data<double>()[0]},
                     {"matrices", matrices},
                     {"bytes_sent", reducer.comm().total_stats().bytes_sent}});
    }
    if (world->rank() == 0) {
      const double base = out[1]["step_s"].get<double>(), rep = out[2]["step_s"].get<double>();
      for (const auto& e : out) {
        std::printf(
            "dp %d %-10s optimizer step %8.3f s  (%5.1f%% lower than gather, %5.1f%% lower than "
            "replicated)\n",
            e["dp"].get<int>(), e["mode"].get<std::string>().c_str(), e["step_s"].get<double>(),
            100.0 * (1.0 - e["step_s"].get<double>() / base),
            100.0 * (1.0 - e["step_s"].get<double>() / rep));
      }
      std::cout << out.dump() << "\n";
    }
  } catch (const Error& e) {
    std::cerr << "rank " << world->rank() << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
