// Tensor parallelism (Megatron style) inside the modules: attention heads
// and the dense SwiGLU split column/row-parallel, the embedding and LM head
// split by vocabulary rows. Without sequence parallelism every tp rank holds
// the full [T, D] activations between modules and a row-parallel output is
// all-reduced; with it, norms and residuals run on a 1/tp slice of the
// tokens, the input of a column-parallel GEMM is all-gathered and a
// row-parallel output reduce-scattered.
//
// The MoE layer is not tp-sharded: the tp ranks split its tokens instead
// (the slice sequence parallelism already holds), so for the MoE every rank
// of dp x tp is a separate token shard and ep groups are cut from all of
// them (Megatron-Core's "MoE parallel folding": attention tp x dp, experts
// ep x edp over the same ranks). The router and shared experts then see
// different tokens on each tp rank: their gradients are partial over tp
// (Parameter::grad_partial_over_tp) and reduced over dp x tp.
#pragma once

#include <cstdint>

#include "moetron/comm/communicator.h"
#include "moetron/core/tensor.h"
#include "moetron/nn/parameter.h"

namespace moetron::nn {

struct TensorParallel {
  int64_t size = 1;
  int64_t rank = 0;
  bool sequence_parallel = false;
  comm::Communicator* group = nullptr;  // the tp ranks, ordered by tp rank; set before forward
  // Ranks of `group` holding the same kv head when tp exceeds n_kv_heads.
  comm::Communicator* kv_group = nullptr;
  // 2-D tensor parallelism (parallel.tp_2d = "RxC", nn/tensor_parallel_2d.h):
  // the R x C grid's rows each run the fields above (size C, sequence
  // parallel) on their own rows of the micro-batch, and every tp-sharded
  // matrix is further split by its rows over the R ranks of a grid column.
  int64_t grid_rows = 1;                  // R (1: 1-D tensor parallelism)
  int64_t grid_row = 0;                   // this rank's row of the grid
  comm::Communicator* columns = nullptr;  // the R ranks of this grid column, by row
  bool on() const { return size > 1; }
  bool grid() const { return grid_rows > 1; }
  // Rows of a token slice: T / size (T must divide).
  int64_t slice_rows(int64_t t) const;
};

// The one-rank default modules use when built without tensor parallelism.
const TensorParallel& no_tensor_parallel();

// [T / tp, D] rows of `full` this rank holds (a view, no copy).
Tensor token_slice(const TensorParallel& tp, const Tensor& full);
// [T, D] = the tp ranks' [T / tp, D] slices in rank order.
Tensor all_gather_tokens(const TensorParallel& tp, const Tensor& slice);
// [T / tp, D]: this rank's slice of the sum over tp of `partial` [T, D].
Tensor reduce_scatter_tokens(const TensorParallel& tp, const Tensor& partial);
// In place: sum over tp.
void all_reduce_tp(const TensorParallel& tp, const Tensor& partial);
// After a row-parallel GEMM: the module's output from its partial [T, D]:
// the full sum (all-reduce) or, under sequence parallelism, this rank's slice.
Tensor finish_row_parallel(const TensorParallel& tp, const Tensor& partial);
// Before a column-parallel GEMM: the full [T, D] input from what the module
// was given (itself, or the gathered slices under sequence parallelism).
Tensor column_parallel_input(const TensorParallel& tp, const Tensor& given);

// The full tensor of a tp-sharded parameter-shaped tensor (value, grad or
// optimizer state): every tp rank's block placed at its offsets.
// Collective over tp.group. An unsharded parameter returns `local`.
Tensor gather_shards(const TensorParallel& tp, const Parameter& p, const Tensor& local);
// Copies this rank's block of `full` into `local`.
void copy_shard(const Parameter& p, const Tensor& full, const Tensor& local);

}  // namespace moetron::nn
