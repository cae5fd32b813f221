#include "util/device_util.h"

#include "moetron/core/device.h"

namespace moetron::test {

bool gpu_available(std::string* why) {
  std::string reason;
  if (!cuda_built()) {
    *why = "CUDA backend not built (MOETRON_CUDA=OFF or no nvcc): CUDA test not run";
    return false;
  }
  if (cuda_device_count(&reason) == 0) {
    *why = "no CUDA device (" + reason + "): CUDA test not run";
    return false;
  }
  return true;
}

Tensor on_device(const kernels::Context& ctx, const Tensor& t) {
  if (!t.defined() || ctx.device() == t.device()) return t;
  return t.clone_to(cuda_allocator(), t.owns_storage() ? t.tag() : MemTag::workspace);
}

Tensor on_host(const Tensor& t) {
  if (!t.defined() || t.device() == Device::cpu) return t;
  return t.clone_to(cpu_allocator(), MemTag::workspace);
}

Tensor empty_on(const kernels::Context& ctx, const Shape& shape, DType dtype) {
  Allocator& alloc = ctx.device() == Device::cuda ? cuda_allocator() : cpu_allocator();
  return Tensor::empty(shape, dtype, MemTag::workspace, alloc);
}

}  // namespace moetron::test
