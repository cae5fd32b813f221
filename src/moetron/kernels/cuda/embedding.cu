// Embedding on the GPU. Forward: one block per token copies its row (or
// zeros for a row of another vocab shard). Backward without atomics, so it
// is deterministic and adds in the CPU's order: a stable radix sort (CUB)
// groups the tokens by local row in token order, then the first token of
// each group sums the group's gradients into its dtable row, one fp32
// addition per token, in token order: the same additions as the CPU and
// the reference, so an f32 dtable gets the same bits.
#include <cub/device/device_radix_sort.cuh>

#include "moetron/kernels/cuda/cuda_util.cuh"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/embedding_checks.h"

namespace moetron::kernels::cuda {

namespace {

constexpr int kThreads = 256;

void check_ids(const char* fn, const Tensor& ids, const Tensor& table, const char* table_name,
               int64_t vocab_offset) {
  embedding_detail::check_ids_shapes(fn, ids, table, table_name, vocab_offset);
  MOETRON_CHECK(ids.dim(0) < kCheckNone, fn, ": ", ids.dim(0), " tokens exceed the CUDA backend's ",
                kCheckNone);
}

__global__ void check_ids_kernel(const int32_t* ids, int64_t T, int32_t* flag) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t < T && ids[t] < 0) atomicMin(flag, static_cast<int32_t>(t));
}

// Negative ids are errors: checked on the device, read back before any output is written.
void check_id_values(CudaState& s, const char* fn, const Tensor& ids) {
  const int64_t T = ids.dim(0);
  if (T == 0) return;
  check_ids_kernel<<<blocks_for(T, kThreads), kThreads, 0, s.stream.get()>>>(dptr<int32_t>(ids), T,
                                                                             reset_check_flag(s));
  check_launch(fn);
  if (const int64_t bad = read_check_flag(s); bad >= 0) {
    MOETRON_FAIL(fn, ": token ", bad, " has negative id ", read_i32(s, ids, bad));
  }
}

template <typename T>
__global__ void forward_kernel(const int32_t* ids, const T* table, T* out, int64_t V, int64_t D,
                               int64_t vocab_offset) {
  const int64_t row = ids[blockIdx.x] - vocab_offset;
  const bool local = row >= 0 && row < V;
  T* o = out + blockIdx.x * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    o[j] = local ? table[row * D + j] : from_f32<T>(0.0f);
  }
}

// key: the local row, or V for a token of another shard (sorted last, skipped).
__global__ void keys_kernel(const int32_t* ids, int64_t T, int64_t V, int64_t vocab_offset,
                            uint32_t* keys, int32_t* tokens) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  const int64_t row = ids[t] - vocab_offset;
  keys[t] = static_cast<uint32_t>(row >= 0 && row < V ? row : V);
  tokens[t] = static_cast<int32_t>(t);
}

// Block i: if sorted position i starts a group, adds the group's dout rows
// into dtable[row] in token order; column blocks along blockIdx.y.
template <typename T>
__global__ void accumulate_kernel(const uint32_t* keys, const int32_t* tokens, const T* dout,
                                  float* dtable, int64_t T_, int64_t V, int64_t D) {
  const int64_t i = blockIdx.x;
  const int64_t row = keys[i];
  if (row == V || (i > 0 && keys[i - 1] == keys[i])) return;
  const int64_t j = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (j >= D) return;
  float acc = dtable[row * D + j];
  for (int64_t k = i; k < T_ && keys[k] == keys[i]; ++k) acc += to_f32(dout[tokens[k] * D + j]);
  dtable[row * D + j] = acc;
}

int end_bit_for(int64_t max_key) {
  int bits = 1;
  while ((int64_t{1} << bits) <= max_key) ++bits;
  return bits;
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out,
                       int64_t vocab_offset) {
  const char* fn = "embedding_forward";
  check_ids(fn, ids, table, "embedding table", vocab_offset);
  const int64_t T = ids.dim(0), V = table.dim(0), D = table.dim(1);
  check_tensor(out, "embedding out", {T, D}, table.dtype());
  check_on_device(fn, {&ids, &table, &out});
  CudaState& s = ctx.cuda_state();
  check_id_values(s, fn, ids);
  if (T == 0 || D == 0) return;
  dispatch_f32_bf16(table.dtype(), fn, [&](auto tag) {
    using S = typename decltype(tag)::type;
    forward_kernel<S><<<blocks_for(T, 1), row_threads(D), 0, s.stream.get()>>>(
        dptr<int32_t>(ids), dptr<S>(table), dptr<S>(out), V, D, vocab_offset);
  });
  check_launch(fn);
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_offset) {
  const char* fn = "embedding_backward";
  check_ids(fn, ids, dtable, "embedding dtable", vocab_offset);
  const int64_t T = ids.dim(0), V = dtable.dim(0), D = dtable.dim(1);
  MOETRON_CHECK(dtable.dtype() == DType::f32, fn, ": dtable must be f32, got ", dtable.str());
  MOETRON_CHECK(V < (int64_t{1} << 31) - 1, fn, ": ", V,
                " rows exceed the CUDA backend's 2^31 - 2");
  check_shape(dout, "embedding dout", {T, D});
  check_on_device(fn, {&ids, &dout, &dtable});
  CudaState& s = ctx.cuda_state();
  check_id_values(s, fn, ids);
  if (T == 0 || V == 0 || D == 0) return;
  const int64_t col_blocks = (D + kThreads - 1) / kThreads;
  MOETRON_CHECK(col_blocks <= 65535, fn, ": D = ", D, " exceeds the CUDA backend's ",
                65535 * kThreads);
  cudaStream_t st = s.stream.get();
  Tensor keys = scratch(s, {2, T}, DType::i32), tokens = scratch(s, {2, T}, DType::i32);
  auto* k_in = static_cast<uint32_t*>(keys.raw());
  int32_t* t_in = dptr<int32_t>(tokens);
  uint32_t* k_out = k_in + T;
  int32_t* t_out = t_in + T;
  keys_kernel<<<blocks_for(T, kThreads), kThreads, 0, st>>>(dptr<int32_t>(ids), T, V, vocab_offset,
                                                            k_in, t_in);
  check_launch(fn);
  const int n = static_cast<int>(T);
  const int end_bit = end_bit_for(V);
  size_t temp_bytes = 0;
  gpu::check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, t_in, t_out, n, 0,
                                             end_bit, st),
             "embedding_backward: cub sort (size)");
  Tensor temp = scratch(s, {static_cast<int64_t>(temp_bytes)}, DType::u8);
  gpu::check(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, k_in, k_out, t_in, t_out, n, 0,
                                             end_bit, st),
             "embedding_backward: cub sort");
  const dim3 grid(blocks_for(T, 1), static_cast<unsigned>(col_blocks));
  dispatch_f32_bf16(dout.dtype(), fn, [&](auto tag) {
    using S = typename decltype(tag)::type;
    accumulate_kernel<S>
        <<<grid, kThreads, 0, st>>>(k_out, t_out, dptr<S>(dout), dptr<float>(dtable), T, V, D);
  });
  check_launch(fn);
}

}  // namespace moetron::kernels::cuda
