// 2-D tensor parallelism (parallel.tp_2d = "RxC"): the tp ranks form an
// R x C grid, tp rank = row * C + column. SUMMA computes the block (i, j) of
// Y = X W as X_i W_j, with X_i (the tokens of row i, every feature) gathered
// along grid row i and W_j (column block j of W, every input feature)
// gathered along grid column j. moetron lays the blocks out so that each of
// those gathers is a contiguous all-gather:
//
// - activations: grid row i holds rows [i B / R, (i + 1) B / R) of the
//   micro-batch (whole sequences, so attention stays local) and runs the
//   1-D machinery of nn/tensor_parallel.h over its C ranks with sequence
//   parallelism: between modules each rank holds a 1/C token slice of its
//   row's tokens, gathered along the row before a GEMM (X_i) and
//   reduce-scattered after the row-parallel one;
// - weights: a matrix the row's C ranks split 1-D (heads, hidden units,
//   vocabulary) is split again by its rows over the R ranks of a grid
//   column, so every rank stores 1/(R C) of it. Before a module runs, its
//   blocks are all-gathered along the column (W_j); after its backward, the
//   gathered gradient is reduce-scattered back along the column, and only
//   the stored block is reduced over dp and updated by the optimizer.
//
// Per GEMM and rank that moves what SUMMA moves: (C - 1)/C of the row's
// activations and (R - 1)/R of the column's weight block, forward and
// again in backward, plus one reduce-scatter of each. Norms, residuals and
// the MoE layers (whose experts are not split: the grid's ranks fold into
// token shards as under 1-D, nn/block.h) run on the token slices.
#pragma once

#include <utility>
#include <vector>

#include "moetron/kernels/context.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/tensor_parallel.h"

namespace moetron::nn {

// Rows of a grid-split block of `rows` rows (R must divide them; `name`
// names the parameter in the error).
int64_t grid_block_rows(const TensorParallel& tp, int64_t rows, const std::string& name);

// Under a grid: reallocates `p` (registered with its 1-D shard) as this
// rank's row block of it and moves its shard offset there. No-op otherwise.
void split_over_grid_column(const TensorParallel& tp, Parameter& p);

// Rows [row * B / R, (row + 1) * B / R) of a [B, ...] tensor (a view).
Tensor grid_row_slice(const TensorParallel& tp, const Tensor& batch_rows);

// A module's weight that is stored as a grid block and gathered for use:
// *value and *grad (its storage slots) are swapped for the gathered
// tensors. `parts`: row ranges [first, first + count) of the stored block
// that are gathered separately; the R blocks of part k land at rows
// [R first, R (first + count)) of the gathered tensor (a fused gate-up
// buffer holds two parts, so the gate's rows stay before the up rows).
struct GridSlot {
  Tensor* value = nullptr;
  Tensor* grad = nullptr;
  std::vector<std::pair<int64_t, int64_t>> parts;
};
GridSlot grid_slot(Parameter& p);

// Gathers a set of slots for the span of one use and puts them back.
class GridGather {
 public:
  explicit GridGather(const TensorParallel& tp) : tp_(tp) {}
  GridGather(const GridGather&) = delete;
  GridGather& operator=(const GridGather&) = delete;
  // Restores whatever is still swapped (gradients not summed: an exception
  // unwinding through a use).
  ~GridGather();
  // values: gather each slot's value; grads: give it a zero gradient of the
  // gathered shape (collected by finish). No-op without a grid.
  void gather(const std::vector<GridSlot>& slots, bool values, bool grads);
  // Reduce-scatters every gathered gradient along the column and adds the
  // sum into the stored block's gradient, then restores the slots.
  void finish(kernels::Context& ctx);

 private:
  struct Held {
    GridSlot slot;
    Tensor value, grad;  // the stored blocks while swapped out
    bool values = false, grads = false;
  };
  void restore();
  const TensorParallel& tp_;
  std::vector<Held> held_;
};

}  // namespace moetron::nn
