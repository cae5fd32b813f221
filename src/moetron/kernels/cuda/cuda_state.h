// The CUDA backend's per-context state: the device, the stream every kernel
// of the context is queued on, the cuBLASLt handle with its workspace and
// the algorithm chosen for each GEMM shape. Host code only; included by the
// CUDA backend's sources (it pulls in the CUDA runtime and cuBLASLt).
#pragma once

#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <map>

#include "moetron/core/cuda/stream.h"
#include "moetron/core/device.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"

namespace moetron::kernels::cuda {

// Everything cuBLASLt's heuristic depends on, so one choice serves every
// later GEMM of the same key (the heuristic costs more than a small GEMM).
struct GemmKey {
  int ab_type = 0, c_type = 0;  // cudaDataType_t
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int align_a = 0, align_b = 0, align_c = 0;  // bytes, powers of two up to 256
  auto operator<=>(const GemmKey&) const = default;
};

struct CudaState {
  explicit CudaState(int device);
  ~CudaState();
  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;

  int device;
  Allocator& alloc;  // cuda_allocator(device)
  // Blocking (core/cuda/stream.h): Tensor::copy_from between host and device
  // is ordered with the kernels queued here without further synchronisation.
  gpu::Stream stream;
  cublasLtHandle_t lt = nullptr;
  Tensor lt_workspace;  // cuBLASLt's scratch, allocated by the first GEMM
  std::map<GemmKey, cublasLtMatmulAlgo_t> gemm_algos;
  Tensor check_flag;       // i32 [1] on the device, see reset_check_flag
  Tensor check_flag_host;  // i32 [1] in pinned memory
};

// Scratch for one kernel call from the device allocator, counted under
// `workspace`. Freed when the Tensor goes; the allocator hands the block out
// again in the order of this context's stream, so no kernel can see it reused
// before the one that used it has run.
Tensor scratch(CudaState& s, const Shape& shape, DType dtype);

// Checks that need the data of device tensors (token ids, targets) run as a
// kernel that atomicMin's the index of the first bad element into a flag,
// and the host reads it back before queuing the kernel that writes the
// outputs: as on the CPU, a bad call writes nothing, at the price of one
// stream synchronisation per call. reset_check_flag queues the flag's reset
// and returns it; read_check_flag waits and returns the flagged index or -1.
inline constexpr int32_t kCheckNone = 0x7f7f7f7f;  // what the memset of 0x7f bytes leaves
int32_t* reset_check_flag(CudaState& s);
int64_t read_check_flag(CudaState& s);

// Element i of a device tensor of i32 ids, read back (for an error message).
int32_t read_i32(CudaState& s, const Tensor& ids, int64_t i);

// Throws naming `fn` when the last kernel launch failed (bad configuration);
// faults inside a kernel surface at the next synchronisation.
void check_launch(const char* fn);

// Throws unless every defined tensor is on the device (the front ends check
// this too; the backend's own entry points do it again for direct callers).
void check_on_device(const char* fn, std::initializer_list<const Tensor*> tensors);

}  // namespace moetron::kernels::cuda
