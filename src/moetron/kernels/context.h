// The one object a kernel receives besides its tensors: which backend runs it
// and that backend's cached state (e.g. oneDNN primitives). No kernel keeps
// global mutable state; whatever must persist between calls lives here.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace moetron::kernels {

enum class Backend { reference, cpu, cuda };
std::string_view backend_name(Backend b);
Backend parse_backend(std::string_view name);

namespace cpu {
struct CpuState;  // defined by the CPU backend (oneDNN engine, stream, primitive cache)
}

// Wall time per kernel function, collected only while enabled (one branch
// per call otherwise): the split of a training step's time by kernel.
class KernelProfile {
 public:
  bool enabled = false;
  void add(const char* fn, double seconds) { seconds_[fn] += seconds; ++calls_[fn]; }
  void reset() {
    seconds_.clear();
    calls_.clear();
  }
  const std::map<std::string, double>& seconds() const { return seconds_; }
  const std::map<std::string, int64_t>& calls() const { return calls_; }

 private:
  std::map<std::string, double> seconds_;
  std::map<std::string, int64_t> calls_;
};

class Context {
 public:
  // num_threads <= 0 keeps the OpenMP default. Sets FTZ/DAZ on the compute threads.
  explicit Context(Backend backend = Backend::cpu, int num_threads = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Backend backend() const { return backend_; }
  // Created on first use.
  cpu::CpuState& cpu_state();
  KernelProfile& profile() { return profile_; }

 private:
  Backend backend_;
  KernelProfile profile_;
  std::unique_ptr<cpu::CpuState> cpu_;
};

// Times one kernel call into ctx.profile() when profiling is enabled.
class ScopedKernelTimer {
 public:
  ScopedKernelTimer(Context& ctx, const char* fn) : profile_(ctx.profile()), fn_(fn) {
    if (profile_.enabled) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedKernelTimer() {
    if (profile_.enabled) {
      profile_.add(fn_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }
  ScopedKernelTimer(const ScopedKernelTimer&) = delete;
  ScopedKernelTimer& operator=(const ScopedKernelTimer&) = delete;

 private:
  KernelProfile& profile_;
  const char* fn_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace moetron::kernels
