// Every byte moetron allocates carries a tag; the allocator keeps the current
// and peak bytes per tag (and in total), so memory reports and the memory
// estimator can be checked against what was really allocated.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
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

// Accounting is exact: bytes counted are the bytes requested rounded up to
// the 64-byte alignment, so two allocations of 1 byte count 128 bytes.
class Allocator {
 public:
  static constexpr size_t kAlignment = 64;

  explicit Allocator(Device device = Device::cpu) : device_(device) {}
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

 private:
  static size_t idx(MemTag t) { return static_cast<size_t>(t); }
  static void raise_peak(std::atomic<int64_t>& peak, int64_t value);

  Device device_;
  std::array<std::atomic<int64_t>, kNumMemTags> current_{};
  std::array<std::atomic<int64_t>, kNumMemTags> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
};

// The process's host allocator. One per process is the honest model of host
// memory; every Tensor allocated on the CPU is counted here.
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
  bool operator==(const TaggedAllocator<U, Tag>&) const { return true; }
};

template <typename T>
using WorkspaceVector = std::vector<T, TaggedAllocator<T, MemTag::workspace>>;

}  // namespace moetron
