// The CUDA backend's context and dispatch: what a machine or build without
// a GPU answers, tensors on the wrong device refused before any kernel runs,
// kernels without a CUDA implementation named, and kernel profiling that
// waits for the GPU. The numerics of each kernel are in its family's test.
#include <gtest/gtest.h>

#include <string>

#include "moetron/core/device.h"
#include "moetron/kernels/activation.h"
#include "moetron/kernels/norm.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

TEST(CudaBackend, ContextWithoutAGpuIsAnErrorSayingWhy) {
  std::string why;
  if (test::gpu_available(&why)) GTEST_SKIP() << "a GPU is usable: the context is created";
  try {
    Context ctx(Backend::cuda);
    ADD_FAILURE() << "a CUDA context was created without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos ||
                msg.find("no CUDA backend") != std::string::npos)
        << msg;
  }
}

TEST(CudaBackend, HostKernelsRefuseDeviceTensorsBeforeTouchingThem) {
  // Never dereferenced: the dispatch's device check comes first.
  alignas(64) static float fake[8 * 4];
  const Tensor x = Tensor::wrap(fake, {8, 4}, DType::f32, Device::cuda);
  const Tensor w = Tensor::zeros({4}, DType::f32), r = Tensor::zeros({8}, DType::f32);
  const Tensor y = Tensor::zeros({8, 4}, DType::f32);
  for (Backend b : {Backend::cpu, Backend::reference}) {
    Context ctx(b);
    try {
      rmsnorm_forward(ctx, x, w, 1e-5f, y, r);
      ADD_FAILURE() << "a device tensor reached the " << backend_name(b) << " backend";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument 1 (f32[8, 4]@cuda) is on cuda"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CudaBackend, CudaKernelsRefuseHostTensors) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  const Tensor x = test::random_tensor({8, 4}, DType::f32, "x");
  const Tensor w = test::on_device(gpu, Tensor::zeros({4}, DType::f32));
  const Tensor r = test::empty_on(gpu, {8}, DType::f32),
               y = test::empty_on(gpu, {8, 4}, DType::f32);
  EXPECT_THROW(rmsnorm_forward(gpu, x, w, 1e-5f, y, r), Error);
}

TEST(CudaBackend, KernelWithoutCudaImplementationIsNamed) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  const Tensor x = test::empty_on(gpu, {4, 4}, DType::f32),
               y = test::empty_on(gpu, {4, 4}, DType::f32);
  try {
    softmax_forward(gpu, x, y);
    ADD_FAILURE() << "softmax_forward ran on a CUDA context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax_forward: no implementation for backend cuda"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaBackend, ProfilingTimesTheKernelNotItsLaunch) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  const int64_t T = 8192, D = 8192;
  const Tensor x = test::on_device(gpu, Tensor::zeros({T, D}, DType::f32));
  const Tensor w = test::on_device(gpu, Tensor::zeros({D}, DType::f32));
  const Tensor y = test::empty_on(gpu, {T, D}, DType::f32),
               r = test::empty_on(gpu, {T}, DType::f32);
  rmsnorm_forward(gpu, x, w, 1e-5f, y, r);  // loads the kernel (lazy module loading)
  gpu.synchronize();
  gpu.profile().enabled = true;
  rmsnorm_forward(gpu, x, w, 1e-5f, y, r);
  // 512 MiB moved cannot take less than 50 us (10 TB/s, twice any HBM3e),
  // while a launch that is not waited for returns in ~5-10 us.
  EXPECT_EQ(gpu.profile().calls().at("rmsnorm_forward"), 1);
  EXPECT_GT(gpu.profile().seconds().at("rmsnorm_forward"), 512e6 / 10e12);
}

}  // namespace
}  // namespace moetron::kernels
