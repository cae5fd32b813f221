// core/device.h in a build without the CUDA backend: no device is visible,
// host memory is the only memory, and asking for device memory says why not.
#include <cstring>

#include "moetron/core/device.h"
#include "moetron/core/error.h"

namespace moetron {

namespace {
constexpr const char* kNoCuda =
    "this build has no CUDA backend (configure with -DMOETRON_CUDA=ON where the CUDA toolkit "
    "is installed)";
}

bool cuda_built() {
  return false;
}

int cuda_device_count(std::string* why) {
  if (why) *why = kNoCuda;
  return 0;
}

Allocator& cuda_allocator(int) {
  MOETRON_FAIL("cuda_allocator: ", kNoCuda);
}

Allocator& pinned_allocator() {
  MOETRON_FAIL("pinned_allocator: ", kNoCuda);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  MOETRON_CHECK(dst_device == Device::cpu && src_device == Device::cpu, "copy_bytes from ",
                device_name(src_device), " to ", device_name(dst_device), ": ", kNoCuda);
  if (bytes) std::memmove(dst, src, bytes);
}

void set_bytes(void* dst, Device device, int value, size_t bytes) {
  MOETRON_CHECK(device == Device::cpu, "set_bytes on ", device_name(device), ": ", kNoCuda);
  if (bytes) std::memset(dst, value, bytes);
}

}  // namespace moetron
