// The memory replay (memory_replay.h) of 2-D tensor parallelism's weight
// gathers (nn/tensor_parallel_2d.h): nn::GridGather's allocations, in its
// order, around each block, the embedding and the head.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/planner/memory_model.h"
#include "moetron/planner/memory_replay.h"

namespace moetron::planner {

class GridWeightsReplay {
 public:
  // `x` is the replay's current dims (held by reference).
  GridWeightsReplay(Replay& r, const MemoryInputs& in, const Dims& x) : r_(r), in_(in), x_(x) {}

  // A weight as gathered: this grid row's whole tp shard [rows, cols]; its
  // stored block is reduce-scattered back in `parts` (a fused gate-up: 2).
  struct Weight {
    int64_t rows = 0, cols = 0, parts = 1;
    bool matrix = true;  // a hidden matrix (matrix_grad gradients), else vocabulary (accum)
  };
  // Block::grid_slots of layer `layer` (none without a grid).
  std::vector<Weight> block(int64_t layer) const;
  // The embedding's or the head's vocabulary shard (none without a grid).
  std::vector<Weight> vocab() const;

  // GridGather::gather: each weight's value and then, with grads, its zero
  // gradient, held until the returned buffers go.
  std::vector<Buf> gather(const std::vector<Weight>& weights, bool values, bool grads);
  // GridGather::finish: each part's reduce-scattered sum, one at a time,
  // then the gathered tensors go.
  void finish(const std::vector<Weight>& weights, std::vector<Buf>& held);

 private:
  DType grad_dtype(const Weight& w) const {
    return w.matrix ? in_.precision.matrix_grad() : in_.precision.accum;
  }
  Replay& r_;
  const MemoryInputs& in_;
  const Dims& x_;
};

}  // namespace moetron::planner
