// The one object a kernel receives besides its tensors: which backend runs it
// and that backend's cached state (e.g. oneDNN primitives). No kernel keeps
// global mutable state; whatever must persist between calls lives here.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "moetron/core/allocator.h"

namespace moetron::kernels {

enum class Backend { reference, cpu, cuda };
std::string_view backend_name(Backend b);
Backend parse_backend(std::string_view name);

namespace cpu {
struct CpuState;  // defined by the CPU backend (oneDNN engine, stream, primitive cache)
}
namespace cuda {
// Defined by the CUDA backend (kernels/cuda/cuda_state.h): device, stream,
// cuBLASLt handle and workspace, GEMM algorithm cache.
struct CudaState;
// Implemented by the CUDA backend; referenced only in builds that have it.
CudaState* create_state(int device);
void destroy_state(CudaState* state) noexcept;
void synchronize(CudaState& state);
}  // namespace cuda

// Wall time per kernel function, collected only while enabled (one branch
// per call otherwise): the split of a training step's time by kernel.
class KernelProfile {
 public:
  bool enabled = false;
  void add(const char* fn, double seconds) {
    seconds_[fn] += seconds;
    ++calls_[fn];
  }
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
  // num_threads <= 0 keeps the current OpenMP thread count; > 0 sets it for
  // the context's lifetime: the destructor puts back the count it found, so
  // a short-lived context (a probe, a conversion) never leaves the process
  // computing on fewer threads than the long-lived one asked for. Sets
  // FTZ/DAZ on the compute threads.
  // Backend::cuda runs on GPU `cuda_device` and throws when this build has no
  // CUDA backend or the device is not there; its kernels take device tensors
  // (core/device.h) and are queued on the context's stream.
  explicit Context(Backend backend = Backend::cpu, int num_threads = 0, int cuda_device = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Backend backend() const { return backend_; }
  // The device a backend's tensors live on.
  Device device() const { return backend_ == Backend::cuda ? Device::cuda : Device::cpu; }
  // Created on first use.
  cpu::CpuState& cpu_state();
  // The CUDA backend's state; throws on any other backend.
  cuda::CudaState& cuda_state();
  // Returns when every kernel this context has queued is finished, throwing
  // the error of one that failed (CUDA). The CPU and reference backends'
  // kernels return finished, so there it returns at once.
  void synchronize();
  KernelProfile& profile() { return profile_; }

 private:
  Backend backend_;
  int restore_threads_ = 0;  // the OpenMP thread count to put back; 0: untouched
  KernelProfile profile_;
  std::unique_ptr<cpu::CpuState> cpu_;
  // A function-pointer deleter: builds without CUDA never name destroy_state.
  std::unique_ptr<cuda::CudaState, void (*)(cuda::CudaState*)> cuda_{nullptr, nullptr};
};

// Times one kernel call into ctx.profile() when profiling is enabled. A CUDA
// kernel returns once queued, so the timer waits for it (only while profiling):
// the split is of kernel time, not of launch time.
class ScopedKernelTimer {
 public:
  ScopedKernelTimer(Context& ctx, const char* fn) : ctx_(ctx), profile_(ctx.profile()), fn_(fn) {
    if (profile_.enabled) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedKernelTimer() {
    if (profile_.enabled) {
      if (ctx_.backend() == Backend::cuda) {
        // A failed kernel's error stays with the stream and is thrown by the
        // next synchronize outside this destructor, which must not throw.
        try {
          ctx_.synchronize();
        } catch (...) {
        }
      }
      profile_.add(
          fn_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }
  ScopedKernelTimer(const ScopedKernelTimer&) = delete;
  ScopedKernelTimer& operator=(const ScopedKernelTimer&) = delete;

 private:
  Context& ctx_;
  KernelProfile& profile_;
  const char* fn_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace moetron::kernels
