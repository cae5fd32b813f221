// Expert-parallel step time and token-exchange bytes on a shortened
// bench-moe under mpirun: ep = 1 (every rank holds every expert) against
// ep = world (each rank holds 1/world of them, tokens exchanged by
// all-to-all(v)), both data-parallel over the world with the same global
// batch. The all-to-all bytes each rank sends, as the communicator counts
// them, are set beside the uniform-routing formula
//   per MoE layer and forward: 2 exchanges (dispatch, combine) of
//   T * k * (ep - 1) / ep rows of D values; backward 2 more,
// so the ratio measured / formula shows the routing's imbalance.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/trainer.h"

namespace {

using namespace moetron;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "data/demo", json_path, config = MOETRON_SOURCE_DIR "/configs/bench-moe.toml";
  int64_t steps = 5, layers = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data")
      data = argv[i + 1];
    else if (a == "--json")
      json_path = argv[i + 1];
    else if (a == "--steps")
      steps = std::stoll(argv[i + 1]);
    else if (a == "--layers")
      layers = std::stoll(argv[i + 1]);
    else if (a == "--config")
      config = argv[i + 1];
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  std::shared_ptr<comm::Communicator> world = comm::make_mpi_world();
  const int n = world->size();
  try {
    nlohmann::json out = nlohmann::json::array();
    for (const int ep : {1, n}) {
      const std::string run = std::filesystem::temp_directory_path().string() +
                              "/moetron_bench_ep_" + std::to_string(n) + "_" + std::to_string(ep);
      if (world->rank() == 0) remove_tree(run);
      world->barrier();
      const train::Config cfg = train::load_config(
          config,
          {"data.path=" + data, "model.n_layers=" + std::to_string(layers),
           "train.steps=" + std::to_string(steps), "train.global_batch=8",
           "train.micro_batch=" + std::to_string(8 / n), "train.threads=1", "train.log_every=1000",
           "train.eval_batches=1", "parallel.ep=" + std::to_string(ep)});
      train::Trainer t(cfg, run, false, world);
      const train::TrainResult r = t.run();
      std::vector<double> step_s;
      for (size_t i = 1; i < r.history.size(); ++i) step_s.push_back(r.history[i].step_s);
      double a2a = 0;
      if (comm::Communicator* ec = t.expert_comm()) {
        for (const auto& [name, st] : ec->stats()) {
          if (name == "alltoallv") a2a = static_cast<double>(st.bytes_sent);
        }
      }
      // Uniform routing: every forward (steps x micro-batches, plus the
      // final evaluation's one batch) moves 2 x T k (ep-1)/ep rows per MoE
      // layer, every backward 2 more.
      const double rows_per_pass =
          static_cast<double>(cfg.train.micro_batch * cfg.train.seq_len * cfg.moe.top_k) *
          (ep - 1) / static_cast<double>(ep);
      int64_t moe_layers = 0;
      for (int64_t i = 0; i < cfg.model.n_layers; ++i) moe_layers += nn::layer_is_moe(cfg.moe, i);
      const double forwards = static_cast<double>(steps * t.accumulation()), evals = 1;
      const double elem = t.model().precision().compute == DType::bf16 ? 2.0 : 4.0;
      const double formula = static_cast<double>(moe_layers) * rows_per_pass *
                             static_cast<double>(cfg.model.d_model) * elem *
                             (4.0 * forwards + 2.0 * evals);
      Tensor v = Tensor::empty({3}, DType::f64);
      v.data<double>()[0] = median(step_s);
      v.data<double>()[1] = a2a;
      v.data<double>()[2] = formula;
      Tensor mx = Tensor::empty({3}, DType::f64);
      mx.copy_from(v);
      world->allreduce(mx, comm::ReduceOp::max);
      world->allreduce(v, comm::ReduceOp::sum);
      out.push_back({{"world", n},
                     {"ep", ep},
                     {"step_s", mx.data<double>()[0]},
                     {"alltoallv_mb_per_step",
                      v.data<double>()[1] / static_cast<double>(n * steps) / 1048576.0},
                     {"formula_mb_per_step",
                      v.data<double>()[2] / static_cast<double>(n * steps) / 1048576.0},
                     {"measured_over_formula",
                      v.data<double>()[2] > 0 ? v.data<double>()[1] / v.data<double>()[2] : 0.0},
                     {"expert_params_per_rank", cfg.moe.num_experts / ep}});
      if (world->rank() == 0) remove_tree(run);
    }
    if (world->rank() == 0) {
      std::printf("%6s %4s %10s %22s %20s %10s\n", "world", "ep", "step_s", "a2a MiB/step/rank",
                  "formula MiB", "ratio");
      for (const auto& e : out) {
        std::printf(
            "%6d %4d %10.3f %22.2f %20.2f %10.3f\n", e["world"].get<int>(), e["ep"].get<int>(),
            e["step_s"].get<double>(), e["alltoallv_mb_per_step"].get<double>(),
            e["formula_mb_per_step"].get<double>(), e["measured_over_formula"].get<double>());
      }
      std::cout << out.dump() << "\n";
      if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    }
  } catch (const Error& e) {
    std::cerr << "rank " << world->rank() << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
