#include "moetron/core/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <string>

#include "moetron/core/error.h"

namespace moetron {

std::string_view mem_tag_name(MemTag tag) {
  switch (tag) {
    case MemTag::params:
      return "params";
    case MemTag::grads:
      return "grads";
    case MemTag::optimizer:
      return "optimizer";
    case MemTag::activations:
      return "activations";
    case MemTag::workspace:
      return "workspace";
    case MemTag::comm:
      return "comm";
  }
  return "?";
}

MemTag parse_mem_tag(std::string_view name) {
  for (int i = 0; i < kNumMemTags; ++i) {
    auto t = static_cast<MemTag>(i);
    if (mem_tag_name(t) == name) return t;
  }
  MOETRON_FAIL("unknown memory tag '", name,
               "' (expected params, grads, optimizer, activations, workspace or comm)");
}

std::string_view device_name(Device d) {
  return d == Device::cpu ? "cpu" : "cuda";
}

void Allocator::raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t old = peak.load(std::memory_order_relaxed);
  while (value > old && !peak.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
}

size_t Allocator::pool_class(size_t bytes) {
  // 8 classes per power of two: the class is the request rounded up to a
  // multiple of 2^(floor(log2(bytes)) - 3).
  const int top = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes));
  const size_t step = size_t{1} << (top - 3);
  return (bytes + step - 1) / step * step;
}

Allocator::~Allocator() {
  release_cached();
}

int64_t Allocator::cached() const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return cached_bytes_;
}

int64_t Allocator::reserved() const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return cached_bytes_ + pooled_in_use_ + unpooled_in_use_.load(std::memory_order_relaxed);
}

void* Allocator::system_allocate(size_t bytes) {
  MOETRON_CHECK(device_ == Device::cpu, "the host allocator cannot allocate ", device_name(device_),
                " memory");
  return std::aligned_alloc(kAlignment, bytes);
}

void Allocator::system_free(void* p) noexcept {
  std::free(p);
}

void Allocator::release_cached() {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) system_free(p);
  }
  free_blocks_.clear();
  cached_bytes_ = 0;
}

void* Allocator::allocate(size_t bytes, MemTag tag) {
  if (bytes == 0) return nullptr;
  const size_t size = rounded(bytes);
  void* p = nullptr;
  if (size >= pool_min_) {
    const size_t cls = pool_class(size);
    {
      std::lock_guard<std::mutex> lock(pool_mutex_);
      auto it = free_blocks_.find(cls);
      if (it != free_blocks_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= static_cast<int64_t>(cls);
      }
    }
    if (p == nullptr) {
      p = system_allocate(cls);
      if (p == nullptr) {
        release_cached();
        p = system_allocate(cls);
      }
    }
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(pool_mutex_);
      pooled_in_use_ += static_cast<int64_t>(cls);
    }
  } else {
    p = system_allocate(size);
    if (p != nullptr)
      unpooled_in_use_.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
  }
  if (p == nullptr) {
    MOETRON_FAIL("out of memory: allocating ", size, " bytes tagged '", mem_tag_name(tag),
                 "' with ", total_current(), " bytes already in use");
  }
  const auto n = static_cast<int64_t>(size);
  raise_peak(peak_[idx(tag)], current_[idx(tag)].fetch_add(n, std::memory_order_relaxed) + n);
  raise_peak(total_peak_, total_current_.fetch_add(n, std::memory_order_relaxed) + n);
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes, MemTag tag) noexcept {
  if (ptr == nullptr) return;
  const size_t size = rounded(bytes);
  if (size >= pool_min_) {
    const size_t cls = pool_class(size);
    std::lock_guard<std::mutex> lock(pool_mutex_);
    try {
      free_blocks_[cls].push_back(ptr);
      cached_bytes_ += static_cast<int64_t>(cls);
    } catch (...) {  // no memory for the free list itself: give the block back
      system_free(ptr);
    }
    pooled_in_use_ -= static_cast<int64_t>(cls);
  } else {
    system_free(ptr);
    unpooled_in_use_.fetch_sub(static_cast<int64_t>(size), std::memory_order_relaxed);
  }
  const auto n = static_cast<int64_t>(size);
  current_[idx(tag)].fetch_sub(n, std::memory_order_relaxed);
  total_current_.fetch_sub(n, std::memory_order_relaxed);
}

MemStats Allocator::stats() const {
  MemStats s;
  for (int i = 0; i < kNumMemTags; ++i) {
    s.current[i] = current_[i].load(std::memory_order_relaxed);
    s.peak[i] = peak_[i].load(std::memory_order_relaxed);
  }
  s.total_current = total_current();
  s.total_peak = total_peak();
  return s;
}

void Allocator::reset_peaks() {
  for (int i = 0; i < kNumMemTags; ++i) {
    peak_[i].store(current_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  total_peak_.store(total_current(), std::memory_order_relaxed);
}

void keep_freed_memory_in_heap() {
  // glibc maps every malloc above its mmap threshold (128 KiB, growing)
  // afresh and unmaps it on free, so a block freed and allocated again
  // first-touches new pages each time (~11 us per 4 KiB on this VM; 7% of a
  // one-rank demo step in the kernel's page-fault path). OpenMPI's
  // non-blocking reductions malloc full-size temporaries on every call the
  // same way. Served from the heap and not trimmed, freed pages are reused:
  // bench/RESULTS.md, "Keeping freed memory in the heap".
  static const bool once = [] {
    // MOETRON_DEFAULT_MALLOC=1 keeps glibc's defaults (for A/B measurements).
    const char* keep = std::getenv("MOETRON_DEFAULT_MALLOC");
    if (keep != nullptr && std::string(keep) == "1") return false;
    ::mallopt(M_MMAP_THRESHOLD, 1 << 30);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)once;
}

Allocator& cpu_allocator() {
  // glibc is set up once, before the first block is allocated.
  static Allocator allocator((keep_freed_memory_in_heap(), Device::cpu));
  return allocator;
}

}  // namespace moetron
