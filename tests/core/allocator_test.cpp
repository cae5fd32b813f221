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
