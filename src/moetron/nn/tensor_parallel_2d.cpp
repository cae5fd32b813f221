#include "moetron/nn/tensor_parallel_2d.h"

#include "moetron/kernels/elementwise.h"

namespace moetron::nn {

namespace {

comm::Communicator& columns_of(const TensorParallel& tp) {
  MOETRON_CHECK(tp.columns && tp.columns->size() == tp.grid_rows, "2-D tensor parallelism over ",
                tp.grid_rows,
                " grid rows without its column communicator (Transformer::set_tensor_group)");
  return *tp.columns;
}

Shape with_rows(Shape s, int64_t rows) {
  s[0] = rows;
  return s;
}

}  // namespace

int64_t grid_block_rows(const TensorParallel& tp, int64_t rows, const std::string& name) {
  MOETRON_CHECK(rows % tp.grid_rows == 0, "parameter '", name, "': its ", rows,
                " rows per grid row do not split over the ", tp.grid_rows,
                " rows of parallel.tp_2d");
  return rows / tp.grid_rows;
}

void split_over_grid_column(const TensorParallel& tp, Parameter& p) {
  if (!tp.grid()) return;
  MOETRON_CHECK(p.sharded(), "parameter '", p.name, "' split over the grid without a tp shard");
  const int64_t rows = grid_block_rows(tp, p.value.dim(0), p.name);
  const Shape shape = with_rows(p.value.shape(), rows);
  p.value = Tensor::empty(shape, p.value.dtype(), MemTag::params);
  p.grad = Tensor::zeros(shape, p.grad.dtype(), MemTag::grads);
  p.shard.row0 += tp.grid_row * rows;
}

Tensor grid_row_slice(const TensorParallel& tp, const Tensor& batch_rows) {
  if (!tp.grid()) return batch_rows;
  const int64_t b = batch_rows.dim(0);
  MOETRON_CHECK(b % tp.grid_rows == 0, "the micro-batch's ", b, " rows do not split over the ",
                tp.grid_rows, " rows of parallel.tp_2d (train.micro_batch must divide)");
  const int64_t rows = b / tp.grid_rows;
  return batch_rows.slice(tp.grid_row * rows, (tp.grid_row + 1) * rows);
}

GridSlot grid_slot(Parameter& p) {
  return GridSlot{&p.value, &p.grad, {{0, p.value.dim(0)}}};
}

GridGather::~GridGather() {
  restore();
}

void GridGather::gather(const std::vector<GridSlot>& slots, bool values, bool grads) {
  if (!tp_.grid()) return;
  comm::Communicator& cols = columns_of(tp_);
  const int64_t r = tp_.grid_rows;
  for (const GridSlot& slot : slots) {
    Held h{slot, *slot.value, *slot.grad, values, grads};
    const Shape full = with_rows(h.value.shape(), h.value.dim(0) * r);
    if (values) {
      Tensor gathered = Tensor::empty(full, h.value.dtype(), MemTag::workspace);
      for (const auto& [first, count] : slot.parts) {
        cols.allgather(h.value.slice(first, first + count),
                       gathered.slice(r * first, r * (first + count)));
      }
      *slot.value = std::move(gathered);
    }
    if (grads) *slot.grad = Tensor::zeros(full, h.grad.dtype(), MemTag::workspace);
    held_.push_back(std::move(h));
  }
}

void GridGather::finish(kernels::Context& ctx) {
  if (held_.empty()) return;
  comm::Communicator& cols = columns_of(tp_);
  const int64_t r = tp_.grid_rows;
  for (Held& h : held_) {
    if (!h.grads) continue;
    const Tensor& gathered = *h.slot.grad;
    for (const auto& [first, count] : h.slot.parts) {
      const Tensor mine = h.grad.slice(first, first + count);
      Tensor sum = Tensor::empty(mine.shape(), mine.dtype(), MemTag::comm);
      cols.reduce_scatter(gathered.slice(r * first, r * (first + count)), sum, comm::ReduceOp::sum);
      // Micro-batches accumulate into the stored block's gradient.
      kernels::add(ctx, mine, sum, mine);
    }
  }
  restore();
}

void GridGather::restore() {
  for (Held& h : held_) {
    if (h.values) *h.slot.value = std::move(h.value);
    if (h.grads) *h.slot.grad = std::move(h.grad);
  }
  held_.clear();
}

}  // namespace moetron::nn
