#include "moetron/kernels/context.h"

#include "moetron/core/error.h"
#include "moetron/core/threading.h"
#include "moetron/kernels/cpu/cpu_state.h"

namespace moetron::kernels {

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::reference:
      return "reference";
    case Backend::cpu:
      return "cpu";
    case Backend::cuda:
      return "cuda";
  }
  return "?";
}

Backend parse_backend(std::string_view name) {
  for (Backend b : {Backend::reference, Backend::cpu, Backend::cuda}) {
    if (backend_name(b) == name) return b;
  }
  MOETRON_FAIL("unknown backend '", name, "' (expected reference, cpu or cuda)");
}

Context::Context(Backend backend, int num_threads, int cuda_device) : backend_(backend) {
  if (backend == Backend::cuda) {
    if constexpr (MOETRON_HAVE_CUDA) {
      cuda_ = {cuda::create_state(cuda_device), &cuda::destroy_state};
    } else {
      MOETRON_FAIL("this build has no CUDA backend (configure with -DMOETRON_CUDA=ON where the ",
                   "CUDA toolkit is installed)");
    }
  }
  if (num_threads > 0 && num_threads != num_compute_threads()) {
    restore_threads_ = num_compute_threads();
  }
  init_compute_threads(num_threads);
}

Context::~Context() {
  if (restore_threads_ > 0) init_compute_threads(restore_threads_);
}

cpu::CpuState& Context::cpu_state() {
  if (!cpu_) cpu_ = std::make_unique<cpu::CpuState>();
  return *cpu_;
}

cuda::CudaState& Context::cuda_state() {
  MOETRON_CHECK(cuda_ != nullptr, "cuda_state() of a context running the ", backend_name(backend_),
                " backend");
  return *cuda_;
}

void Context::synchronize() {
  if constexpr (MOETRON_HAVE_CUDA) {
    if (cuda_) cuda::synchronize(*cuda_);
  }
}

}  // namespace moetron::kernels
