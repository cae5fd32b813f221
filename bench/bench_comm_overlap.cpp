// moetron_bench_overlap: how much of a large non-blocking MPI_Iallreduce
// progresses while the rank computes. Run under `mpirun -np 2` with
// OMP_NUM_THREADS=1. The variants (--variants, comma-separated) run
// interleaved, one after another in every repetition, so the load of a
// shared machine falls on all of them alike:
//
//   none         post MPI_Iallreduce, compute, MPI_Wait (no progress help)
//   poll         MPI_Test on the request after every compute chunk
//   thread       MPI_THREAD_MULTIPLE and a thread that spins MPI_Iprobe on a
//                private communicator (drives OpenMPI's progress engine
//                without touching the request the compute thread owns)
//   thread-sleep the same thread, sleeping --sleep-us between probes
//   backend      comm::make_mpi_world(): allreduce_async, Communicator::poll()
//                after every chunk, Work::wait() (the shipped behaviour)
//
// MPI is initialised with MPI_THREAD_MULTIPLE when a thread variant is asked
// for, else with FUNNELED as the backend does. The raw variants copy the buffer into
// a reused send buffer and reduce out of place (counted as "post"): OpenMPI
// 4.1's in-place MPI_Iallreduce allocates and first-touches a full-size
// temporary inside the call (--inplace shows it).
//
// Per repetition it times the allreduce alone, the compute alone, and then
// each variant overlapped; every time is the slowest rank's. Reported (medians):
// wait_after = time from the end of compute to completion; hidden = share of
// the allreduce-alone time that no longer shows: 1 - wait_after / comm_alone;
// slowdown = overlapped compute time (post included) / compute alone;
// saved = 1 - total / (comm alone + compute alone), the gain over running
// them back to back (on one core per rank the reduction itself is CPU work).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/kernels/matmul.h"

namespace {

using namespace moetron;
using clock_type = std::chrono::steady_clock;

double now_s() {
  return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
}

// Slowest rank's value.
double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Probes a private communicator while `active`; parks on a condition
// variable otherwise, so it takes no core between operations.
class ProbeThread {
 public:
  explicit ProbeThread(int sleep_us) : sleep_us_(sleep_us) {
    MPI_Comm_dup(MPI_COMM_WORLD, &probe_comm_);
    thread_ = std::thread([this] { loop(); });
  }
  ~ProbeThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    MPI_Comm_free(&probe_comm_);
  }
  void set_active(bool on) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      active_ = on;
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [this] { return stop_ || active_; });
      if (stop_) return;
      lk.unlock();
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, probe_comm_, &flag, MPI_STATUS_IGNORE);
      if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
      lk.lock();
    }
  }
  int sleep_us_;
  MPI_Comm probe_comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false, stop_ = false;
  std::thread thread_;
};

struct Sample {
  double comm_alone, compute_alone, post, compute_overlapped, wait_after, total;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moetron_bench_overlap: progress of a non-blocking allreduce during compute"};
  std::string variants_arg = "none,poll,thread,thread-sleep", json_path;
  int64_t mbytes = 64, matmuls = 40, dim = 512, reps = 9;
  int sleep_us = 100;
  bool inplace = false;
  app.add_option("--variants", variants_arg,
                 "comma-separated: none, poll, thread, thread-sleep, backend");
  app.add_option("--mb", mbytes, "allreduce size in MiB (f32)");
  app.add_option("--matmuls", matmuls, "compute chunks: f32 matmuls of dim x dim x dim");
  app.add_option("--dim", dim, "matmul size");
  app.add_option("--reps", reps, "repetitions (medians reported)");
  app.add_option("--sleep-us", sleep_us, "thread-sleep: microseconds between probes");
  app.add_flag("--inplace", inplace,
               "raw variants: MPI_IN_PLACE instead of a copy into a send buffer");
  app.add_option("--json", json_path, "append one JSON line per variant (rank 0)");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> variants;
  bool need_multiple = false;
  for (size_t b = 0; b <= variants_arg.size();) {
    size_t e = variants_arg.find(',', b);
    if (e == std::string::npos) e = variants_arg.size();
    const std::string v = variants_arg.substr(b, e - b);
    if (v != "none" && v != "poll" && v != "thread" && v != "thread-sleep" && v != "backend") {
      std::cerr << "error: --variants: unknown variant '" << v
                << "' (allowed: none, poll, thread, thread-sleep, backend)\n";
      return 2;
    }
    need_multiple = need_multiple || v == "thread" || v == "thread-sleep";
    variants.push_back(v);
    b = e + 1;
  }

  int provided = 0;
  const int want = need_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
  MPI_Init_thread(&argc, &argv, want, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (provided < want) {
    std::cerr << "rank " << rank << ": error: MPI provides thread level " << provided << " < "
              << want << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  try {
    std::shared_ptr<comm::Communicator> world;
    if (std::find(variants.begin(), variants.end(), "backend") != variants.end())
      world = comm::make_mpi_world();
    kernels::Context ctx(kernels::Backend::cpu);
    Tensor a = Tensor::empty({dim, dim}, DType::f32), b = Tensor::empty({dim, dim}, DType::f32);
    Tensor c = Tensor::empty({dim, dim}, DType::f32);
    a.fill(0.5);
    b.fill(0.25);
    const int64_t count = mbytes * (1 << 20) / 4;
    const int n = static_cast<int>(count);
    Tensor buf = Tensor::empty({count}, DType::f32, MemTag::comm);
    buf.fill(1.0);
    Tensor send = Tensor::empty({count}, DType::f32, MemTag::comm);
    send.fill(0.0);
    auto post_iallreduce = [&](MPI_Request* req) {
      if (inplace) {
        MPI_Iallreduce(MPI_IN_PLACE, buf.raw(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req);
      } else {
        std::memcpy(send.raw(), buf.raw(), buf.nbytes());
        MPI_Iallreduce(send.raw(), buf.raw(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req);
      }
    };
    std::unique_ptr<ProbeThread> spinner, sleeper;
    for (const auto& v : variants) {
      if (v == "thread" && !spinner) spinner = std::make_unique<ProbeThread>(0);
      if (v == "thread-sleep" && !sleeper) sleeper = std::make_unique<ProbeThread>(sleep_us);
    }

    // `between` runs after every matmul (the poll of a variant).
    auto compute = [&](const std::function<void()>& between) {
      for (int64_t i = 0; i < matmuls; ++i) {
        kernels::matmul(ctx, a, b, c, {});
        if (between) between();
      }
    };
    compute(nullptr);  // warm-up: primitive creation, first touch
    {
      MPI_Request req;
      post_iallreduce(&req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }

    std::vector<std::vector<Sample>> samples(variants.size());
    for (int64_t rep = 0; rep < reps; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_s();
      {
        MPI_Request req;
        post_iallreduce(&req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
      }
      const double comm_alone = max_over_ranks(now_s() - t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_s();
      compute(nullptr);
      const double compute_alone = max_over_ranks(now_s() - t0);

      for (size_t vi = 0; vi < variants.size(); ++vi) {
        const std::string& v = variants[vi];
        Sample s{comm_alone, compute_alone, 0, 0, 0, 0};
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now_s();
        double t_compute_end = 0;
        if (v == "backend") {
          auto work = world->allreduce_async(buf, comm::ReduceOp::sum);
          s.post = now_s() - t0;
          compute([&] { world->poll(); });
          t_compute_end = now_s();
          work->wait();
        } else {
          ProbeThread* prober = v == "thread"         ? spinner.get()
                                : v == "thread-sleep" ? sleeper.get()
                                                      : nullptr;
          MPI_Request req;
          post_iallreduce(&req);
          s.post = now_s() - t0;
          if (prober) prober->set_active(true);
          if (v == "poll") {
            compute([&] {
              int flag = 0;
              MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
            });
          } else {
            compute(nullptr);
          }
          t_compute_end = now_s();
          MPI_Wait(&req, MPI_STATUS_IGNORE);
          if (prober) prober->set_active(false);
        }
        const double t_end = now_s();
        s.post = max_over_ranks(s.post);
        s.compute_overlapped = max_over_ranks(t_compute_end - t0);
        s.wait_after = max_over_ranks(t_end - t_compute_end);
        s.total = max_over_ranks(t_end - t0);
        samples[vi].push_back(s);
      }
    }
    spinner.reset();
    sleeper.reset();

    for (size_t vi = 0; vi < variants.size(); ++vi) {
      auto med = [&](auto f) {
        std::vector<double> x;
        for (const auto& s : samples[vi]) x.push_back(f(s));
        return median(x);
      };
      const double comm_alone = med([](const Sample& s) { return s.comm_alone; });
      const double compute_alone = med([](const Sample& s) { return s.compute_alone; });
      const double post = med([](const Sample& s) { return s.post; });
      const double overlapped = med([](const Sample& s) { return s.compute_overlapped; });
      const double wait_after = med([](const Sample& s) { return s.wait_after; });
      const double total = med([](const Sample& s) { return s.total; });
      // Per repetition, then the median: robust to a slow repetition.
      const double hidden =
          med([](const Sample& s) { return std::max(0.0, 1.0 - s.wait_after / s.comm_alone); });
      const double saved =
          med([](const Sample& s) { return 1.0 - s.total / (s.comm_alone + s.compute_alone); });
      if (rank != 0) continue;
      std::printf(
          "%-12s ranks %d  %lld MiB | alone: comm %6.1f ms  compute %6.1f ms | overlapped: post "
          "%5.1f ms  "
          "compute %6.1f ms  wait after %6.1f ms  total %6.1f ms | hidden %3.0f%%  saved vs serial "
          "%3.0f%%\n",
          variants[vi].c_str(), size, static_cast<long long>(mbytes), 1e3 * comm_alone,
          1e3 * compute_alone, 1e3 * post, 1e3 * overlapped, 1e3 * wait_after, 1e3 * total,
          100 * hidden, 100 * saved);
      if (!json_path.empty()) {
        std::ofstream f(json_path, std::ios::app);
        f << nlohmann::json{{"variant", variants[vi]},
                            {"ranks", size},
                            {"mib", mbytes},
                            {"matmuls", matmuls},
                            {"dim", dim},
                            {"sleep_us", sleep_us},
                            {"inplace", inplace},
                            {"reps", reps},
                            {"comm_alone_s", comm_alone},
                            {"compute_alone_s", compute_alone},
                            {"post_s", post},
                            {"compute_overlapped_s", overlapped},
                            {"wait_after_s", wait_after},
                            {"total_s", total},
                            {"hidden", hidden},
                            {"saved", saved}}
                 .dump()
          << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": error: " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  return 0;
}
