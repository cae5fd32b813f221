// Data-parallel step time on a shortened bench-moe (4 of its 8 layers, same
// shapes), global batch fixed at 8 sequences of 512: per dp size (the mpirun
// world), overlap on and off, the median step time, the exposed
// communication (end of backward to start of the optimizer, blocked on
// gradient buckets) and the fraction of the step the rank computes.
//
//   mpirun -np 2 build/bench/moetron_bench_dp --data data/demo --json out.json
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
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
  int64_t steps = 6, layers = 4;
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
  const int dp = world->size();
  try {
    nlohmann::json out = nlohmann::json::array();
    for (const bool overlap : {true, false}) {
      const std::string run = std::filesystem::temp_directory_path().string() +
                              "/moetron_bench_dp_" + std::to_string(dp) +
                              (overlap ? "_on" : "_off");
      if (world->rank() == 0) remove_tree(run);
      world->barrier();
      const train::Config cfg = train::load_config(
          config, {"data.path=" + data, "model.n_layers=" + std::to_string(layers),
                   "train.steps=" + std::to_string(steps), "train.global_batch=8",
                   "train.micro_batch=" + std::to_string(8 / dp), "train.threads=1",
                   "train.log_every=1000", "train.eval_batches=" + std::to_string(dp),
                   std::string("parallel.overlap=") + (overlap ? "true" : "false")});
      train::Trainer t(cfg, run, false, world);
      const train::TrainResult r = t.run();
      std::vector<double> step_s, wait_s;
      for (size_t i = 1; i < r.history.size(); ++i) {  // step 1 creates primitives and buffers
        step_s.push_back(r.history[i].step_s);
        wait_s.push_back(r.history[i].comm_wait_s);
      }
      const double st = median(step_s), wt = median(wait_s);
      // The slowest rank sets the pace: report rank-maximum medians.
      Tensor v = Tensor::empty({2}, DType::f64);
      v.data<double>()[0] = st;
      v.data<double>()[1] = wt;
      world->allreduce(v, comm::ReduceOp::max);
      const double grad_mb =
          static_cast<double>(t.reducer() ? t.reducer()->padded_numel() * 4 : 0) / 1048576.0;
      out.push_back({{"dp", dp},
                     {"overlap", overlap},
                     {"step_s", v.data<double>()[0]},
                     {"exposed_comm_s", v.data<double>()[1]},
                     {"compute_fraction", 1.0 - v.data<double>()[1] / v.data<double>()[0]},
                     {"buckets", t.reducer() ? t.reducer()->buckets().size() : 0},
                     {"grad_mb", grad_mb},
                     {"tokens_per_s", 8.0 * 512.0 / v.data<double>()[0]}});
      if (world->rank() == 0) remove_tree(run);
    }
    if (world->rank() == 0) {
      std::printf("%4s %8s %10s %16s %10s %10s\n", "dp", "overlap", "step_s", "exposed_comm_s",
                  "compute", "tok/s");
      for (const auto& e : out) {
        std::printf("%4d %8s %10.3f %16.3f %9.1f%% %10.0f\n", e["dp"].get<int>(),
                    e["overlap"].get<bool>() ? "on" : "off", e["step_s"].get<double>(),
                    e["exposed_comm_s"].get<double>(), 100.0 * e["compute_fraction"].get<double>(),
                    e["tokens_per_s"].get<double>());
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
