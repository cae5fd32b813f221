#include "moetron/kernels/context.h"

#include "moetron/core/error.h"
#include "moetron/core/threading.h"
#include "moetron/kernels/cpu/cpu_state.h"

namespace moetron::kernels {

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

Backend parse_backend(std::string_view name) {
  for (Backend b : {Backend::reference, Backend::cpu, Backend::cuda}) {
    if (backend_name(b) == name) return b;
  }
  MOETRON_FAIL("unknown backend '", name, "' (expected reference, cpu or cuda)");
}

Context::Context(Backend backend, int num_threads) : backend_(backend) {
  MOETRON_CHECK(backend != Backend::cuda, "this build has no CUDA backend");
  init_compute_threads(num_threads);
}

Context::~Context() = default;

cpu::CpuState& Context::cpu_state() {
  if (!cpu_) cpu_ = std::make_unique<cpu::CpuState>();
  return *cpu_;
}

}  // namespace moetron::kernels
