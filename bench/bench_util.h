// A small benchmark harness: each bench/bench_<family>.cpp registers cases
// with MOETRON_BENCH; the runner times them (median of repeats), prints a
// table and writes every number as JSON, once per requested thread count.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace moetron::bench {

struct Result {
  std::string name;                           // e.g. "matmul/qkv_proj/bf16"
  std::map<std::string, std::string> labels;  // shape, dtype, ...
  std::map<std::string, double> metrics;      // seconds, gflops, ratio, ...
};

class Runner {
 public:
  Runner(bool quick, int threads) : quick_(quick), threads_(threads) {}
  bool quick() const { return quick_; }
  int threads() const { return threads_; }
  // Median wall seconds of one call to fn, after one warm-up call; repeats
  // until min_seconds (shorter in quick mode) and at least 3 times.
  double time_median(const std::function<void()>& fn, double min_seconds = 0.5) const;
  void record(Result r);
  const std::vector<Result>& results() const { return results_; }

 private:
  bool quick_;
  int threads_;
  std::vector<Result> results_;
};

using BenchFn = std::function<void(Runner&)>;
struct Registration {
  Registration(const char* name, BenchFn fn);
};
std::vector<std::pair<std::string, BenchFn>>& registry();

}  // namespace moetron::bench

#define MOETRON_BENCH_CAT2(a, b) a##b
#define MOETRON_BENCH_CAT(a, b) MOETRON_BENCH_CAT2(a, b)
// MOETRON_BENCH("family", fn) registers fn(Runner&) under a family name.
#define MOETRON_BENCH(name, fn) \
  static ::moetron::bench::Registration MOETRON_BENCH_CAT(moetron_bench_, __LINE__)(name, fn)
