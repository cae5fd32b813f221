#include "moetron/nn/tensor_parallel.h"

#include <cstring>

namespace moetron::nn {

namespace {

comm::Communicator& group_of(const TensorParallel& tp) {
  MOETRON_CHECK(tp.group && tp.group->size() == tp.size, "tensor parallelism over ", tp.size,
                " ranks without its communicator (Transformer::set_tensor_group)");
  return *tp.group;
}

}  // namespace

const TensorParallel& no_tensor_parallel() {
  static const TensorParallel none;
  return none;
}

int64_t TensorParallel::slice_rows(int64_t t) const {
  MOETRON_CHECK(t % size == 0, "the ", t, " tokens of a micro-batch do not split over the ", size,
                " tensor-parallel ranks (micro_batch * seq_len must divide by parallel.tp)");
  return t / size;
}

Tensor token_slice(const TensorParallel& tp, const Tensor& full) {
  if (!tp.on()) return full;
  const int64_t rows = tp.slice_rows(full.dim(0));
  return full.slice(tp.rank * rows, (tp.rank + 1) * rows);
}

Tensor all_gather_tokens(const TensorParallel& tp, const Tensor& slice) {
  if (!tp.on()) return slice;
  Shape shape = slice.shape();
  shape[0] *= tp.size;
  Tensor full = Tensor::empty(shape, slice.dtype());
  group_of(tp).allgather(slice, full);
  return full;
}

Tensor reduce_scatter_tokens(const TensorParallel& tp, const Tensor& partial) {
  if (!tp.on()) return partial;
  Shape shape = partial.shape();
  shape[0] = tp.slice_rows(shape[0]);
  Tensor slice = Tensor::empty(shape, partial.dtype());
  group_of(tp).reduce_scatter(partial, slice, comm::ReduceOp::sum);
  return slice;
}

void all_reduce_tp(const TensorParallel& tp, const Tensor& partial) {
  if (tp.on()) group_of(tp).allreduce(partial, comm::ReduceOp::sum);
}

Tensor finish_row_parallel(const TensorParallel& tp, const Tensor& partial) {
  if (tp.sequence_parallel) return reduce_scatter_tokens(tp, partial);
  all_reduce_tp(tp, partial);
  return partial;
}

Tensor column_parallel_input(const TensorParallel& tp, const Tensor& given) {
  return tp.sequence_parallel ? all_gather_tokens(tp, given) : given;
}

Tensor gather_shards(const TensorParallel& tp, const Parameter& p, const Tensor& local) {
  if (!p.sharded()) return local;
  comm::Communicator& g = group_of(tp);
  MOETRON_CHECK(local.shape() == p.value.shape(), "parameter '", p.name, "': gathering ",
                local.str(), " as its shard ", p.value.str());
  const int64_t n = local.numel();
  Tensor blocks = Tensor::empty({tp.size * n}, local.dtype(), MemTag::comm);
  g.allgather(local.reshape({n}), blocks);
  Tensor offsets = Tensor::empty({2 * tp.size}, DType::i64, MemTag::comm);
  Tensor mine = Tensor::empty({2}, DType::i64, MemTag::comm);
  mine.data<int64_t>()[0] = p.shard.row0;
  mine.data<int64_t>()[1] = p.shard.col0;
  g.allgather(mine, offsets);
  Tensor full = Tensor::empty(p.shard.full, local.dtype(), MemTag::comm);
  const int64_t rows = local.dim(0), cols = local.numel() / rows;
  const int64_t full_cols = p.shard.full.numel() / p.shard.full[0];
  const size_t es = local.element_size();
  for (int64_t r = 0; r < tp.size; ++r) {
    const int64_t row0 = offsets.data<int64_t>()[2 * r], col0 = offsets.data<int64_t>()[2 * r + 1];
    const auto* src = static_cast<const char*>(blocks.raw()) + static_cast<size_t>(r * n) * es;
    auto* dst = static_cast<char*>(full.raw());
    for (int64_t i = 0; i < rows; ++i) {
      // Ranks sharing a block (replicated kv heads) write the same values.
      std::memcpy(dst + static_cast<size_t>((row0 + i) * full_cols + col0) * es,
                  src + static_cast<size_t>(i * cols) * es, static_cast<size_t>(cols) * es);
    }
  }
  return full;
}

void copy_shard(const Parameter& p, const Tensor& full, const Tensor& local) {
  if (!p.sharded()) {
    local.copy_from(full);
    return;
  }
  MOETRON_CHECK(full.shape() == p.shard.full && full.dtype() == local.dtype(), "parameter '",
                p.name, "': cutting its shard from ", full.str(), ", expected ",
                p.shard.full.str());
  const int64_t rows = local.dim(0), cols = local.numel() / rows;
  const int64_t full_cols = full.numel() / full.dim(0);
  const size_t es = local.element_size();
  const auto* src = static_cast<const char*>(full.raw());
  auto* dst = static_cast<char*>(local.raw());
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(dst + static_cast<size_t>(i * cols) * es,
                src + static_cast<size_t>((p.shard.row0 + i) * full_cols + p.shard.col0) * es,
                static_cast<size_t>(cols) * es);
  }
}

}  // namespace moetron::nn
