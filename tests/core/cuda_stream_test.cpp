// Streams, events and asynchronous copies (core/cuda/stream.h). Built only
// with the CUDA backend; skips, saying why, where no GPU can be used.
#include "moetron/core/cuda/stream.h"

#include <gtest/gtest.h>

#include <cstring>

#include "moetron/core/device.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::gpu {
namespace {

TEST(CudaStream, AsyncCopiesThroughPinnedMemoryAreOrderedByEvents) {
  MOETRON_SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  const Tensor src = test::random_tensor({n}, DType::f32, "src");
  const Tensor pinned_in = Tensor::empty({n}, DType::f32, MemTag::comm, pinned_allocator());
  const Tensor pinned_out = Tensor::empty({n}, DType::f32, MemTag::comm, pinned_allocator());
  pinned_in.copy_from(src);
  pinned_out.poison();
  const Tensor dev = Tensor::empty({n}, DType::f32, MemTag::comm, cuda_allocator());
  // Copy in on one stream, out on another that waits for the first's event.
  Stream in(0), out(0, /*blocking=*/false);
  Event start(true), copied(true), done;
  start.record(in);
  copy_async(dev, pinned_in, in);
  copied.record(in);
  out.wait(copied);
  copy_async(pinned_out, dev, out);
  done.record(out);
  done.synchronize();
  EXPECT_TRUE(done.done());
  EXPECT_EQ(std::memcmp(pinned_out.raw(), src.raw(), src.nbytes()), 0);
  EXPECT_GE(copied.elapsed_ms(start), 0.0f);
  EXPECT_TRUE(is_pinned(pinned_in.raw()));
  EXPECT_FALSE(is_pinned(src.raw()));
}

TEST(CudaStream, AsyncCopyOfPageableHostMemoryIsRefused) {
  MOETRON_SKIP_WITHOUT_GPU();
  const Tensor host = Tensor::zeros({64}, DType::f32);
  const Tensor dev = Tensor::empty({64}, DType::f32, MemTag::workspace, cuda_allocator());
  Stream s(0);
  EXPECT_THROW(copy_async(dev, host, s), Error);
}

}  // namespace
}  // namespace moetron::gpu
