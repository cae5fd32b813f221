// core/device.h on the CUDA runtime: the caching device and pinned-host
// allocators (the accounting is the host allocator's, core/allocator.h) and
// the synchronous copies.
#include <array>
#include <cstring>
#include <memory>
#include <mutex>

#include "moetron/core/cuda/stream.h"
#include "moetron/core/device.h"
#include "moetron/core/error.h"

namespace moetron {

namespace {

// cudaMalloc on one device; every size is cached (pool_min_bytes 0) because
// cudaMalloc costs ~10-100 us and cudaFree synchronises the whole device.
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device) : Allocator(Device::cuda, 0), device_(device) {}
  ~DeviceAllocator() override { release_cached(); }

 protected:
  void* system_allocate(size_t bytes) override {
    gpu::set_device(device_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the error: the caller retries after releasing the cache
      return nullptr;
    }
    return p;
  }
  // At process exit the runtime may be gone already; the memory goes with it.
  void system_free(void* p) noexcept override { cudaFree(p); }

 private:
  int device_;
};

class PinnedAllocator final : public Allocator {
 public:
  PinnedAllocator() : Allocator(Device::cpu, 0) {}
  ~PinnedAllocator() override { release_cached(); }

 protected:
  void* system_allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void system_free(void* p) noexcept override { cudaFreeHost(p); }
};

cudaMemcpyKind copy_kind(Device dst, Device src) {
  if (src == Device::cpu) return dst == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
  return dst == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

}  // namespace

bool cuda_built() {
  return true;
}

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver reports no device";
  return n;
}

Allocator& cuda_allocator(int device) {
  std::string why;
  const int count = cuda_device_count(&why);
  MOETRON_CHECK(device >= 0 && device < count, "cuda_allocator: no CUDA device ", device, " (",
                count, " visible", why.empty() ? "" : ": ", why, ")");
  // Never destroyed: tensors in other static objects may be freed after any
  // static allocator would be, and the process's exit returns the memory.
  static std::mutex mutex;
  static auto* allocators = new std::array<std::unique_ptr<DeviceAllocator>, 64>();
  MOETRON_CHECK(device < static_cast<int>(allocators->size()), "cuda_allocator: device ", device,
                " beyond the supported ", allocators->size());
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*allocators)[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<DeviceAllocator>(device);
  return *slot;
}

Allocator& pinned_allocator() {
  static auto* allocator = new PinnedAllocator();
  return *allocator;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  gpu::check(cudaMemcpy(dst, src, bytes, copy_kind(dst_device, src_device)),
             "copy_bytes: cudaMemcpy");
}

void set_bytes(void* dst, Device device, int value, size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::cpu) {
    std::memset(dst, value, bytes);
    return;
  }
  // cudaMemset is asynchronous for device memory; the copy semantics promise a finished write.
  gpu::check(cudaMemset(dst, value, bytes), "set_bytes: cudaMemset");
  gpu::check(cudaStreamSynchronize(nullptr), "set_bytes: cudaStreamSynchronize");
}

}  // namespace moetron
