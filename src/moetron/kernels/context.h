// The one object a kernel receives besides its tensors: which backend runs it
// and that backend's cached state (e.g. oneDNN primitives). No kernel keeps
// global mutable state; whatever must persist between calls lives here.
#pragma once

#include <memory>
#include <string_view>

namespace moetron::kernels {

enum class Backend { reference, cpu, cuda };
std::string_view backend_name(Backend b);
Backend parse_backend(std::string_view name);

namespace cpu {
struct CpuState;  // defined by the CPU backend (oneDNN engine, stream, primitive cache)
}

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

 private:
  Backend backend_;
  std::unique_ptr<cpu::CpuState> cpu_;
};

}  // namespace moetron::kernels
