// A small benchmark harness: each bench/bench_<family>.cpp registers cases
// with MOETRON_BENCH; the runner times them (median of repeats), prints a
// table and writes every number as JSON, once per requested thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace moetron::bench {

struct Result {
  std::string name;                           // e.g. "matmul/qkv_proj/bf16"
  std::map<std::string, std::string> labels;  // shape, dtype, ...
  std::map<std::string, double> metrics;      // seconds, gflops, ratio, ...
};

// The opt-in long_sequence family's settings (bench_long_sequence.cpp).
struct LongSequenceOptions {
  std::vector<std::string> modes = {"full", "hybrid", "hybrid_chunked"};
  std::vector<int64_t> seqs = {4096, 8192, 16384, 32768, 65536, 131072};
  int64_t chunk = 4096;   // hybrid_chunked's sequence chunk
  int64_t window = 1024;  // local layers' sliding window
  // hybrid modes' layer pattern: LLLLLG (Gemma 3) or L (Longformer: every
  // layer local + the global tokens, O(S (W + G)) throughout)
  std::string pattern = "LLLLLG";
  double max_gb = 20;        // skip a point whose predicted peak exceeds this
  double max_seconds = 600;  // skip a point predicted to take longer (warm-up included)
};

struct Options {
  int warmup = 1;  // untimed calls before timing
  LongSequenceOptions long_seq;
};

class Runner {
 public:
  Runner(bool quick, int threads, Options opts = {})
      : quick_(quick), threads_(threads), opts_(std::move(opts)) {}
  bool quick() const { return quick_; }
  int threads() const { return threads_; }
  const Options& options() const { return opts_; }
  // Median wall seconds of one call to fn, after options().warmup warm-up calls; repeats
  // until min_seconds (shorter in quick mode) and at least 3 times.
  double time_median(const std::function<void()>& fn, double min_seconds = 0.5) const;
  void record(Result r);
  const std::vector<Result>& results() const { return results_; }

 private:
  bool quick_;
  int threads_;
  Options opts_;
  std::vector<Result> results_;
};

using BenchFn = std::function<void(Runner&)>;
struct Family {
  std::string name;
  BenchFn fn;
  bool opt_in = false;  // runs only when --filter is exactly its name (slow families)
};
struct Registration {
  Registration(const char* name, BenchFn fn, bool opt_in = false);
};
std::vector<Family>& registry();

}  // namespace moetron::bench

#define MOETRON_BENCH_CAT2(a, b) a##b
#define MOETRON_BENCH_CAT(a, b) MOETRON_BENCH_CAT2(a, b)
// MOETRON_BENCH("family", fn) registers fn(Runner&) under a family name.
#define MOETRON_BENCH(name, fn) \
  static ::moetron::bench::Registration MOETRON_BENCH_CAT(moetron_bench_, __LINE__)(name, fn)
// MOETRON_BENCH_OPT_IN("family", fn): skipped unless `--filter family` names it.
#define MOETRON_BENCH_OPT_IN(name, fn) \
  static ::moetron::bench::Registration MOETRON_BENCH_CAT(moetron_bench_, __LINE__)(name, fn, true)
