#include "moetron/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moetron {
namespace {

TEST(Tensor, ViewsShareStorageAndSliceLeadingDim) {
  Tensor t = Tensor::empty({4, 3}, DType::f32);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), Shape({2, 3}));
  EXPECT_EQ(rows.data<float>()[0], 3.0f);
  Tensor r2 = t[2];
  EXPECT_EQ(r2.shape(), Shape({3}));
  EXPECT_EQ(r2.data<float>()[1], 7.0f);
  Tensor flat = t.reshape({12});
  flat.data<float>()[5] = 42.0f;
  EXPECT_EQ(t.data<float>()[5], 42.0f);
  EXPECT_THROW(t.reshape({5, 2}), Error);
  EXPECT_THROW(t.slice(2, 5), Error);
}

TEST(Tensor, WrongDtypeAccessThrows) {
  Tensor t = Tensor::zeros({2}, DType::bf16);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_NO_THROW(t.data<bf16>());
}

TEST(Tensor, PoisonMakesFloatsNaN) {
  Tensor t = Tensor::zeros({5}, DType::f32);
  t.poison();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(std::isnan(t.data<float>()[i]));
}

TEST(Tensor, WrapDoesNotAllocate) {
  float buf[6] = {};
  const int64_t before = cpu_allocator().total_current();
  Tensor t = Tensor::wrap(buf, {2, 3}, DType::f32);
  EXPECT_FALSE(t.owns_storage());
  EXPECT_EQ(cpu_allocator().total_current(), before);
  t.fill(2.5);
  EXPECT_EQ(buf[4], 2.5f);
}

TEST(Shape, SmallVectorSemantics) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_THROW(s.dim(3), Error);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), Error);
}

}  // namespace
}  // namespace moetron
