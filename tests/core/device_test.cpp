// Device memory (core/device.h) and device tensors: the caching device
// allocator's per-tag accounting, explicit copies, pinned host memory, and
// what a build or machine without a GPU answers. The GPU cases skip, saying
// why, where no GPU can be used.
#include "moetron/core/device.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "moetron/core/error.h"
#include "moetron/core/tensor.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron {
namespace {

TEST(Device, WithoutAGpuTheCountIsZeroWithAReasonAndDeviceMemoryIsAnError) {
  std::string why;
  if (cuda_device_count(&why) > 0)
    GTEST_SKIP() << "a GPU is visible: the no-GPU answers do not apply";
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(cuda_allocator(), Error);
  // Host to host still copies.
  Tensor a = test::random_tensor({33}, DType::f32, "a"), b = Tensor::empty({33}, DType::f32);
  b.copy_from(a);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST(Device, HostCodeCannotReadDeviceTensorElements) {
  // A view of "device memory" that is never dereferenced: the check comes first.
  alignas(64) static float fake[4];
  const Tensor t = Tensor::wrap(fake, {4}, DType::f32, Device::cuda);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_EQ(t.str(), "f32[4]@cuda");
  EXPECT_THROW(t.clone(), Error);  // a view of device memory names no allocator
}

TEST(Device, CudaAllocatorCountsPerTagAndCachesEverySize) {
  MOETRON_SKIP_WITHOUT_GPU();
  Allocator& dev = cuda_allocator();
  EXPECT_EQ(dev.device(), Device::cuda);
  dev.reset_peaks();
  const MemStats before = dev.stats();
  const auto params = static_cast<size_t>(MemTag::params);
  const auto grads = static_cast<size_t>(MemTag::grads);
  void* first = nullptr;
  {
    Tensor p = Tensor::empty({100}, DType::f32, MemTag::params, dev);      // 400 -> 448 bytes
    Tensor g = Tensor::empty({3, 1000}, DType::bf16, MemTag::grads, dev);  // 6000 -> 6016
    first = p.raw();
    EXPECT_EQ(p.device(), Device::cuda);
    EXPECT_EQ(dev.current(MemTag::params) - before.current[params], 448);
    EXPECT_EQ(dev.current(MemTag::grads) - before.current[grads], 6016);
    EXPECT_EQ(dev.total_peak() - before.total_current, 448 + 6016);
  }
  EXPECT_EQ(dev.current(MemTag::params), before.current[params]);
  EXPECT_EQ(dev.peak(MemTag::params) - before.current[params], 448);
  // A small block is cached too (cudaFree would synchronise the device) and
  // comes back for the next request of its size class.
  EXPECT_GE(dev.cached(), 448);
  Tensor again = Tensor::empty({100}, DType::f32, MemTag::activations, dev);
  EXPECT_EQ(again.raw(), first);
  dev.release_cached();
  EXPECT_EQ(dev.cached(), 0);
}

TEST(Device, CopiesRoundTripAndDeviceTensorsFillZeroPoisonAndClone) {
  MOETRON_SKIP_WITHOUT_GPU();
  Allocator& dev = cuda_allocator();
  const Tensor host = test::random_tensor({7, 130}, DType::bf16, "h");
  const Tensor d1 = host.clone_to(dev);
  const Tensor d2 = d1.clone();  // device to device, on the same allocator
  EXPECT_EQ(d2.device(), Device::cuda);
  const Tensor back = d2.clone_to(cpu_allocator());
  EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0);
  // A slice of a device tensor copies from its offset.
  const Tensor row = Tensor::empty({130}, DType::bf16);
  row.copy_from(d1[3]);
  EXPECT_EQ(std::memcmp(row.raw(), host[3].raw(), row.nbytes()), 0);

  const Tensor z = Tensor::zeros({33}, DType::f32, MemTag::workspace, dev);
  const Tensor f = Tensor::empty({33}, DType::f32, MemTag::workspace, dev);
  f.fill(2.5);
  const Tensor p = Tensor::empty({33}, DType::f32, MemTag::workspace, dev);
  p.poison();
  const Tensor zh = test::on_host(z), fh = test::on_host(f), ph = test::on_host(p);
  for (int64_t i = 0; i < 33; ++i) {
    EXPECT_EQ(zh.data<float>()[i], 0.0f);
    EXPECT_EQ(fh.data<float>()[i], 2.5f);
    EXPECT_TRUE(std::isnan(ph.data<float>()[i]));
  }
}

TEST(Device, PinnedTensorsAreHostTensorsCountedInTheirOwnAllocator) {
  MOETRON_SKIP_WITHOUT_GPU();
  Allocator& pinned = pinned_allocator();
  const int64_t before = pinned.current(MemTag::comm);
  {
    const Tensor t = Tensor::zeros({1000}, DType::f32, MemTag::comm, pinned);
    EXPECT_EQ(t.device(), Device::cpu);
    EXPECT_EQ(pinned.current(MemTag::comm) - before, 4032);
    t.data<float>()[999] = 1.0f;  // host memory: the host may write it
    const Tensor back = t.clone_to(cuda_allocator()).clone_to(cpu_allocator());
    EXPECT_EQ(back.data<float>()[999], 1.0f);
  }
  EXPECT_EQ(pinned.current(MemTag::comm), before);
}

}  // namespace
}  // namespace moetron
