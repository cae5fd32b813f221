#include "moetron/core/allocator.h"
#include "moetron/core/error.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "moetron/core/tensor.h"

namespace moetron {
namespace {

TEST(Allocator, CountsExactBytesPerTagAndPeak) {
  Allocator alloc;
  void* a = alloc.allocate(100, MemTag::params);  // rounds to 128
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(alloc.current(MemTag::params), 128);
  void* b = alloc.allocate(64, MemTag::activations);
  void* c = alloc.allocate(1, MemTag::activations);
  EXPECT_EQ(alloc.current(MemTag::activations), 128);
  EXPECT_EQ(alloc.total_current(), 256);
  alloc.deallocate(b, 64, MemTag::activations);
  EXPECT_EQ(alloc.current(MemTag::activations), 64);
  EXPECT_EQ(alloc.peak(MemTag::activations), 128);
  EXPECT_EQ(alloc.total_peak(), 256);
  void* d = alloc.allocate(640, MemTag::grads);
  EXPECT_EQ(alloc.total_peak(), 128 + 64 + 640);
  EXPECT_EQ(alloc.peak(MemTag::grads), 640);
  EXPECT_EQ(alloc.current(MemTag::optimizer), 0);
  alloc.deallocate(a, 100, MemTag::params);
  alloc.deallocate(c, 1, MemTag::activations);
  alloc.deallocate(d, 640, MemTag::grads);
  EXPECT_EQ(alloc.total_current(), 0);
  alloc.reset_peaks();
  EXPECT_EQ(alloc.total_peak(), 0);
  EXPECT_EQ(alloc.peak(MemTag::grads), 0);
}

TEST(Allocator, TensorsAreCountedUnderTheirTagAndReleased) {
  Allocator& alloc = cpu_allocator();
  const int64_t before = alloc.current(MemTag::optimizer);
  {
    Tensor t = Tensor::empty({3, 5}, DType::f32, MemTag::optimizer);
    EXPECT_EQ(alloc.current(MemTag::optimizer) - before, 64);  // 60 bytes rounded up
    Tensor view = t.slice(1, 2);  // views share storage: nothing new counted
    EXPECT_EQ(alloc.current(MemTag::optimizer) - before, 64);
    Tensor u = Tensor::zeros({1000}, DType::bf16, MemTag::optimizer);
    EXPECT_EQ(alloc.current(MemTag::optimizer) - before, 64 + 2048);
  }
  EXPECT_EQ(alloc.current(MemTag::optimizer), before);
}

TEST(Allocator, ParsesTagNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_mem_tag("comm"), MemTag::comm);
  EXPECT_THROW(parse_mem_tag("weights"), Error);
}

}  // namespace
}  // namespace moetron

namespace moetron {
namespace {

TEST(Allocator, LargeBlocksAreCachedAndReusedWithExactTagAccounting) {
  Allocator alloc;
  const size_t big = (size_t{3} << 20) + 100;  // 3 MiB + 100 bytes
  void* a = alloc.allocate(big, MemTag::activations);
  EXPECT_EQ(alloc.current(MemTag::activations), static_cast<int64_t>(Allocator::rounded(big)));
  const size_t cls = Allocator::pool_class(Allocator::rounded(big));
  EXPECT_GE(cls, Allocator::rounded(big));
  EXPECT_LE(cls, Allocator::rounded(big) * 9 / 8);
  EXPECT_EQ(alloc.reserved(), static_cast<int64_t>(cls));
  alloc.deallocate(a, big, MemTag::activations);
  EXPECT_EQ(alloc.current(MemTag::activations), 0);
  EXPECT_EQ(alloc.cached(), static_cast<int64_t>(cls));
  // A request of the same class gets the cached block back.
  void* b = alloc.allocate(big - 50, MemTag::grads);
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc.cached(), 0);
  EXPECT_EQ(alloc.current(MemTag::grads), static_cast<int64_t>(Allocator::rounded(big - 50)));
  alloc.deallocate(b, big - 50, MemTag::grads);
  alloc.release_cached();
  EXPECT_EQ(alloc.reserved(), 0);
  // Classes: 8 per power of two.
  EXPECT_EQ(Allocator::pool_class(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(Allocator::pool_class((size_t{1} << 20) + 1), (size_t{1} << 20) + (size_t{1} << 17));
}

}  // namespace
}  // namespace moetron
