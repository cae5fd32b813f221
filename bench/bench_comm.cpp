// moetron_bench_comm: bus bandwidth of the collectives against message size,
// reported as nccl-tests does. Run under `mpirun -np N`.
//
// size  = the largest buffer of the operation in bytes (nccl-tests' count x
//         type size x ranks where the op has chunks): the buffer for
//         allreduce, the full send buffer for reduce_scatter and alltoall,
//         the full receive buffer for allgather;
// time  = median over iterations (after warm-up) of the slowest rank's time;
// algbw = size / time;
// busbw = algbw x 2(n-1)/n for allreduce, x (n-1)/n for the others.
//
// Each size is timed through the moetron MPI backend (blocking calls, which
// wait on its non-blocking operations) and through the plain blocking MPI
// call, and checked once on known data (`wrong` counts bad elements).
// --wait-hook DIR also times the backend with the heartbeat wait hook that
// `moetron launch` ranks run with (comm/wait_hook.h, train/heartbeat.h;
// heartbeats go to DIR): an MPI_Testall loop instead of MPI_Waitall.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/comm/wait_hook.h"
#include "moetron/core/error.h"
#include "moetron/train/heartbeat.h"
#include "moetron/train/launcher.h"

namespace {

using namespace moetron;
using clock_type = std::chrono::steady_clock;

double now_s() {
  return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
}

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// Median of the slowest rank's time per call, after `warmup` calls; the
// iteration count is fixed on rank 0 from the warm-up time (~target seconds).
double time_op(const std::function<void()>& op, int warmup, double target) {
  double warm = 0;
  for (int i = 0; i < warmup; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    op();
    warm = max_over_ranks(now_s() - t0);
  }
  int iters = std::clamp(static_cast<int>(target / std::max(warm, 1e-6)), 3, 50);
  MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    op();
    t.push_back(max_over_ranks(now_s() - t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct OpCase {
  const char* name;
  double bus_factor;  // busbw / algbw
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moetron_bench_comm: collective bus bandwidth against message size (run under mpirun)"};
  std::string json_path, ops_arg = "allreduce,reduce_scatter,allgather,alltoall";
  int64_t min_bytes = 4096, max_bytes = 64 << 20, factor = 4;
  int warmup = 2;
  double target = 0.2;
  app.add_option("--ops", ops_arg,
                 "comma-separated: allreduce, reduce_scatter, allgather, alltoall");
  app.add_option("--min-bytes", min_bytes, "smallest size");
  app.add_option("--max-bytes", max_bytes, "largest size");
  app.add_option("--factor", factor, "size multiplier from one row to the next")
      ->check(CLI::Range(2, 64));
  app.add_option("--warmup", warmup, "untimed calls per size")->check(CLI::Range(1, 100));
  app.add_option("--target-seconds", target,
                 "timed seconds per size and path (3 to 50 iterations)");
  app.add_option("--json", json_path, "write every row as JSON (rank 0)");
  std::string hook_dir;
  app.add_option("--wait-hook", hook_dir,
                 "also time the backend with the heartbeat wait hook, beating into this "
                 "directory");
  CLI11_PARSE(app, argc, argv);

  std::shared_ptr<comm::Communicator> world = comm::make_mpi_world();
  const int rank = world->rank(), n = world->size();
  comm::WaitHook hook = nullptr;
  if (!hook_dir.empty()) {
    ::setenv(train::kLaunchLogDirEnv, hook_dir.c_str(), 1);
    train::start_heartbeats(rank);
    hook = comm::wait_hook();
    comm::set_wait_hook(nullptr);  // installed only around its own timing
  }
  int status = 0;
  try {
    std::vector<OpCase> ops;
    const double ring = static_cast<double>(n - 1) / n;
    for (size_t b = 0; b <= ops_arg.size();) {
      size_t e = ops_arg.find(',', b);
      if (e == std::string::npos) e = ops_arg.size();
      const std::string op = ops_arg.substr(b, e - b);
      if (op == "allreduce")
        ops.push_back({"allreduce", 2 * ring});
      else if (op == "reduce_scatter")
        ops.push_back({"reduce_scatter", ring});
      else if (op == "allgather")
        ops.push_back({"allgather", ring});
      else if (op == "alltoall")
        ops.push_back({"alltoall", ring});
      else
        MOETRON_FAIL("--ops: unknown collective '", op,
                     "' (allowed: allreduce, reduce_scatter, allgather, alltoall)");
      b = e + 1;
    }
    MOETRON_CHECK(min_bytes >= 4 * n && min_bytes <= max_bytes, "--min-bytes ", min_bytes,
                  " must be >= 4 x ranks and <= --max-bytes ", max_bytes);

    if (rank == 0) {
      std::printf(
          "# moetron_bench_comm: %d ranks, f32, sum; time = median of the slowest rank (us)\n", n);
      std::printf("# %-14s %10s %10s | %-27s | %-27s | %s\n", "", "", "", "    moetron MPI backend",
                  "    blocking MPI call", "");
      std::printf("# %-14s %10s %10s | %9s %8s %8s | %9s %8s %8s | %s\n", "op", "size(B)", "count",
                  "time", "algbw", "busbw", "time", "algbw", "busbw", "wrong");
    }
    nlohmann::json rows = nlohmann::json::array();
    for (const OpCase& oc : ops) {
      const std::string op = oc.name;
      for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
        const int64_t count = bytes / 4 / n * n;  // whole chunks of n
        const int64_t chunk = count / n;
        const bool big_src = op != "allgather";  // allgather's large buffer is its destination
        Tensor big = Tensor::zeros({count}, DType::f32, MemTag::comm);
        Tensor small = Tensor::zeros({chunk}, DType::f32, MemTag::comm);
        Tensor other = Tensor::zeros({count}, DType::f32, MemTag::comm);  // alltoall's destination
        const int c = static_cast<int>(count), k = static_cast<int>(chunk);

        std::function<void()> backend, raw;
        if (op == "allreduce") {
          backend = [&] { world->allreduce(big, comm::ReduceOp::sum); };
          raw = [&] {
            MPI_Allreduce(MPI_IN_PLACE, big.raw(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          };
        } else if (op == "reduce_scatter") {
          backend = [&] { world->reduce_scatter(big, small, comm::ReduceOp::sum); };
          raw = [&] {
            MPI_Reduce_scatter_block(big.raw(), small.raw(), k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          };
        } else if (op == "allgather") {
          backend = [&] { world->allgather(small, big); };
          raw = [&] {
            MPI_Allgather(small.raw(), k, MPI_FLOAT, big.raw(), k, MPI_FLOAT, MPI_COMM_WORLD);
          };
        } else {
          backend = [&] { world->alltoall(big, other); };
          raw = [&] {
            MPI_Alltoall(big.raw(), k, MPI_FLOAT, other.raw(), k, MPI_FLOAT, MPI_COMM_WORLD);
          };
        }

        // Check the backend once: element i of rank r's input is r + 1 + (i % 7).
        Tensor& in = big_src ? big : small;
        for (int64_t i = 0; i < in.numel(); ++i)
          in.data<float>()[i] = static_cast<float>(rank + 1 + i % 7);
        backend();
        int64_t wrong = 0;
        const float rank_sum = static_cast<float>(n * (n + 1) / 2);
        if (op == "allreduce") {
          for (int64_t i = 0; i < count; ++i)
            wrong += big.data<float>()[i] != rank_sum + n * (i % 7);
        } else if (op == "reduce_scatter") {
          for (int64_t i = 0; i < chunk; ++i)
            wrong += small.data<float>()[i] != rank_sum + n * ((rank * chunk + i) % 7);
        } else if (op == "allgather") {
          for (int64_t i = 0; i < count; ++i)
            wrong += big.data<float>()[i] != static_cast<float>(i / chunk + 1 + (i % chunk) % 7);
        } else {  // chunk q of the result came from rank q: its chunk `rank`
          for (int64_t i = 0; i < count; ++i) {
            wrong += other.data<float>()[i] !=
                     static_cast<float>(i / chunk + 1 + (rank * chunk + i % chunk) % 7);
          }
        }
        int64_t all_wrong = 0;
        MPI_Allreduce(&wrong, &all_wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        big.fill(0.0);
        small.fill(0.0);

        const double t_backend = time_op(backend, warmup, target);
        const double t_raw = time_op(raw, warmup, target);
        double t_hook = 0;
        if (hook != nullptr) {
          comm::set_wait_hook(hook);
          t_hook = time_op(backend, warmup, target);
          comm::set_wait_hook(nullptr);
        }
        const double size = static_cast<double>(count) * 4;
        if (rank == 0) {
          const double a1 = size / t_backend / 1e9, a2 = size / t_raw / 1e9;
          std::printf("  %-14s %10.0f %10lld | %9.1f %8.3f %8.3f | %9.1f %8.3f %8.3f | %lld",
                      oc.name, size, static_cast<long long>(count), 1e6 * t_backend, a1,
                      a1 * oc.bus_factor, 1e6 * t_raw, a2, a2 * oc.bus_factor,
                      static_cast<long long>(all_wrong));
          if (hook != nullptr) std::printf(" | with wait hook %9.1f us", 1e6 * t_hook);
          std::printf("\n");
          std::fflush(stdout);
          rows.push_back(
              {{"op", op},
               {"ranks", n},
               {"bytes", size},
               {"count", count},
               {"backend",
                {{"time_us", 1e6 * t_backend},
                 {"algbw_gbs", a1},
                 {"busbw_gbs", a1 * oc.bus_factor}}},
               {"mpi",
                {{"time_us", 1e6 * t_raw}, {"algbw_gbs", a2}, {"busbw_gbs", a2 * oc.bus_factor}}},
               {"wrong", all_wrong}});
          if (hook != nullptr) rows.back()["backend_wait_hook_time_us"] = 1e6 * t_hook;
        }
        if (all_wrong != 0) status = 1;
      }
    }
    if (rank == 0 && !json_path.empty()) {
      std::ofstream f(json_path);
      MOETRON_CHECK(f.good(), "cannot write --json file '", json_path, "'");
      f << nlohmann::json{{"ranks", n}, {"dtype", "f32"}, {"rows", rows}}.dump(1) << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": error: " << e.what() << std::endl;
    comm::abort_world(1);
    return 1;
  }
  if (status != 0 && rank == 0)
    std::cerr << "error: some collectives returned wrong values (column `wrong`)\n";
  return status;
}
