// Every byte moetron allocates carries a tag; the allocator keeps the current
// and peak bytes per tag (and in total), so memory reports and the memory
// estimator can be checked against what was really allocated.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moetron {

enum class MemTag : uint8_t { params, grads, optimizer, activations, workspace, comm };
inline constexpr int kNumMemTags = 6;

std::string_view mem_tag_name(MemTag tag);
MemTag parse_mem_tag(std::string_view name);

enum class Device : uint8_t { cpu, cuda };
std::string_view device_name(Device d);

struct MemStats {
  std::array<int64_t, kNumMemTags> current{};
  std::array<int64_t, kNumMemTags> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;  // peak of the sum, not the sum of per-tag peaks
};

// Accounting is exact: bytes counted per tag are the bytes requested rounded
// up to the 64-byte alignment, so two allocations of 1 byte count 128 bytes.
//
// Blocks of kPoolMinBytes and more are cached on free and reused: on the
// machines we run on, the first touch of freshly mapped memory costs ~3.5 ms
// per MiB (page faults in a VM), 25x the time a SwiGLU pass spends on the
// same bytes, and a training step allocates the same shapes every step.
// Cached sizes are rounded up to one of 8 classes per power of two (<= 12.5%
// slack). reserved() counts what the process holds for tensors: blocks in use
// at their class size plus the cache. release_cached() returns the cache to
// the system (also done, then retried, when an allocation fails).
//
// The accounting and the cache are the same for every kind of memory; only
// where blocks come from differs. Derived allocators (core/cuda/: device
// memory, pinned host memory) override system_allocate/system_free, cache
// blocks of every size (a cudaMalloc or cudaFree costs far more than a page
// fault, and cudaFree synchronises the device), and call release_cached() in
// their own destructor: the base destructor can no longer reach their
// system_free.
class Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kPoolMinBytes = size_t{256} << 10;

  explicit Allocator(Device device = Device::cpu) : Allocator(device, kPoolMinBytes) {}
  virtual ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns 64-byte aligned memory (nullptr for 0 bytes); throws moetron::Error
  // naming the tag and size when the system refuses.
  void* allocate(size_t bytes, MemTag tag);
  void deallocate(void* ptr, size_t bytes, MemTag tag) noexcept;

  static size_t rounded(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  int64_t current(MemTag tag) const { return current_[idx(tag)].load(std::memory_order_relaxed); }
  int64_t peak(MemTag tag) const { return peak_[idx(tag)].load(std::memory_order_relaxed); }
  int64_t total_current() const { return total_current_.load(std::memory_order_relaxed); }
  int64_t total_peak() const { return total_peak_.load(std::memory_order_relaxed); }
  MemStats stats() const;
  // Sets every peak to the current value, so a phase's own peak can be measured.
  void reset_peaks();
  Device device() const { return device_; }
  int64_t reserved() const;
  int64_t cached() const;
  void release_cached();
  // The size class a pooled request of `bytes` occupies.
  static size_t pool_class(size_t bytes);

 protected:
  // Blocks of pool_min_bytes and more are cached (0: every block).
  Allocator(Device device, size_t pool_min_bytes) : device_(device), pool_min_(pool_min_bytes) {}
  // A block of `bytes` (a multiple of kAlignment) aligned to at least
  // kAlignment, or nullptr when the system refuses. The base class takes
  // host memory from the C heap and refuses any other device.
  virtual void* system_allocate(size_t bytes);
  virtual void system_free(void* p) noexcept;

 private:
  static size_t idx(MemTag t) { return static_cast<size_t>(t); }
  static void raise_peak(std::atomic<int64_t>& peak, int64_t value);

  Device device_;
  size_t pool_min_;
  mutable std::mutex pool_mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // by class size
  int64_t cached_bytes_ = 0;
  int64_t pooled_in_use_ = 0;
  std::atomic<int64_t> unpooled_in_use_{0};
  std::array<std::atomic<int64_t>, kNumMemTags> current_{};
  std::array<std::atomic<int64_t>, kNumMemTags> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
};

// The process's host allocator. One per process is the honest model of host
// memory; every Tensor allocated on the CPU is counted here.
// Sets glibc's malloc to serve blocks up to 1 GiB from the heap and keep
// freed memory there (see the .cpp for why); idempotent. cpu_allocator()
// calls it, and so does MPI's initialisation (for OpenMPI's temporaries).
void keep_freed_memory_in_heap();
Allocator& cpu_allocator();

// A standard-library allocator that counts through cpu_allocator() under a
// tag, so kernels' scratch vectors are counted like tensors:
//   std::vector<float, TaggedAllocator<float>> scratch(n);
template <typename T, MemTag Tag = MemTag::workspace>
struct TaggedAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = TaggedAllocator<U, Tag>;
  };
  TaggedAllocator() = default;
  template <typename U>
  TaggedAllocator(const TaggedAllocator<U, Tag>&) {}  // NOLINT: converting, as allocators must be
  T* allocate(size_t n) { return static_cast<T*>(cpu_allocator().allocate(n * sizeof(T), Tag)); }
  void deallocate(T* p, size_t n) noexcept { cpu_allocator().deallocate(p, n * sizeof(T), Tag); }
  template <typename U>
  bool operator==(const TaggedAllocator<U, Tag>&) const {
    return true;
  }
};

template <typename T>
using WorkspaceVector = std::vector<T, TaggedAllocator<T, MemTag::workspace>>;

}  // namespace moetron
