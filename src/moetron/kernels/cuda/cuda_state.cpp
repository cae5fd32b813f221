#include "moetron/kernels/cuda/cuda_state.h"

#include "moetron/core/error.h"

namespace moetron::kernels::cuda {

namespace {
void check_lt(cublasStatus_t st, const char* what) {
  MOETRON_CHECK(st == CUBLAS_STATUS_SUCCESS, what, ": ", cublasLtGetStatusName(st), ": ",
                cublasLtGetStatusString(st));
}

Allocator& device_allocator(int device) {
  std::string why;
  const int count = cuda_device_count(&why);
  MOETRON_CHECK(device >= 0 && device < count, "CUDA backend: no CUDA device ", device, " (", count,
                " visible", why.empty() ? "" : ": ", why, ")");
  return cuda_allocator(device);
}
}  // namespace

CudaState::CudaState(int dev) : device(dev), alloc(device_allocator(dev)), stream(dev) {
  check_lt(cublasLtCreate(&lt), "cublasLtCreate");
  check_flag = Tensor::empty({1}, DType::i32, MemTag::workspace, alloc);
  check_flag_host = Tensor::empty({1}, DType::i32, MemTag::workspace, pinned_allocator());
}

CudaState::~CudaState() {
  // Queued kernels may still use the workspace this state returns to the
  // allocator; let them finish (errors can no longer be reported here).
  cudaStreamSynchronize(stream.get());
  cublasLtDestroy(lt);
}

CudaState* create_state(int device) {
  return new CudaState(device);
}
void destroy_state(CudaState* state) noexcept {
  delete state;
}
void synchronize(CudaState& state) {
  state.stream.synchronize();
}

Tensor scratch(CudaState& s, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, MemTag::workspace, s.alloc);
}

int32_t* reset_check_flag(CudaState& s) {
  gpu::check(cudaMemsetAsync(s.check_flag.raw(), 0x7f, sizeof(int32_t), s.stream.get()),
             "cudaMemsetAsync (check flag)");
  return static_cast<int32_t*>(s.check_flag.raw());
}

int64_t read_check_flag(CudaState& s) {
  gpu::check(cudaMemcpyAsync(s.check_flag_host.raw(), s.check_flag.raw(), sizeof(int32_t),
                             cudaMemcpyDeviceToHost, s.stream.get()),
             "cudaMemcpyAsync (check flag)");
  s.stream.synchronize();
  const int32_t v = s.check_flag_host.data<int32_t>()[0];
  return v == kCheckNone ? -1 : v;
}

int32_t read_i32(CudaState& s, const Tensor& ids, int64_t i) {
  int32_t v = 0;
  gpu::check(cudaMemcpyAsync(&v, static_cast<const int32_t*>(ids.raw()) + i, sizeof(v),
                             cudaMemcpyDeviceToHost, s.stream.get()),
             "cudaMemcpyAsync (read_i32)");
  s.stream.synchronize();
  return v;
}

void check_launch(const char* fn) {
  gpu::check(cudaGetLastError(), fn);
}

void check_on_device(const char* fn, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    MOETRON_CHECK(!t->defined() || t->device() == Device::cuda, fn, ": ", t->str(),
                  " is not a device tensor (the CUDA backend takes tensors from cuda_allocator())");
  }
}

}  // namespace moetron::kernels::cuda
