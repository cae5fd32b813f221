// MoeLayer's expert parallelism: each of the ep ranks routes its own tokens
// with the replicated router, the (token, expert) slots travel to the rank
// holding their expert by one all-to-all(v), the local experts run as one
// grouped GEMM, and the outputs travel back by the reverse all-to-all(v);
// backward moves the gradients along the same two exchanges.
//
// Equal to one rank holding the ep group's tokens: an expert's rows arrive
// ordered by (source rank, token), which is the global token order because
// rank r holds rows [r * mb, (r + 1) * mb) of the group's micro-batch; and
// under a capacity factor every rank knows every rank's per-expert counts
// (one small all-gather), so it keeps exactly the slots that one rank's
// token-ordered plan would keep and sends nothing that will be dropped.
#include <algorithm>
#include <cmath>

#include "moetron/nn/moe.h"

namespace moetron::nn {

void MoeLayer::set_expert_group(comm::Communicator* group) {
  if (ep_size_ == 1 && (!group || group->size() == 1)) return;
  MOETRON_CHECK(group && group->size() == ep_size_, prefix_, "block_sparse_moe: built for ",
                ep_size_, " expert-parallel ranks but given a group of ",
                group ? group->size() : 0);
  ep_group_ = group;
}

const std::vector<int64_t>& MoeLayer::expert_offsets() const {
  return ep_size_ > 1 ? saved_.exchange.offsets : saved_.plan.offsets;
}

void MoeLayer::plan_expert_parallel(const std::vector<int64_t>& counts, int64_t tokens) {
  MOETRON_CHECK(ep_group_, prefix_, "block_sparse_moe: expert parallelism without an expert group");
  Saved& s = saved_;
  const int64_t n = ep_size_, stride = e_ + 1, me = ep_group_->rank();
  Tensor mine = Tensor::empty({stride}, DType::i64, MemTag::comm);
  std::copy(counts.begin(), counts.end(), mine.data<int64_t>());
  mine.data<int64_t>()[e_] = tokens;
  Tensor all = Tensor::empty({n * stride}, DType::i64, MemTag::comm);
  ep_group_->allgather(mine, all);
  const int64_t* c = all.data<int64_t>();
  int64_t group_tokens = 0;
  for (int64_t r = 0; r < n; ++r) group_tokens += c[r * stride + e_];
  const int64_t capacity =
      capacity_factor_ > 0
          ? static_cast<int64_t>(std::ceil(static_cast<double>(group_tokens * k_) *
                                           capacity_factor_ / static_cast<double>(e_)))
          : -1;
  // kept[r * E + e]: slots of rank r kept by expert e, earlier ranks first.
  std::vector<int64_t> kept(static_cast<size_t>(n * e_));
  for (int64_t e = 0; e < e_; ++e) {
    int64_t before = 0;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t want = c[r * stride + e];
      kept[static_cast<size_t>(r * e_ + e)] =
          capacity < 0 ? want : std::clamp<int64_t>(capacity - before, 0, want);
      before += want;
    }
  }
  const auto k_of = [&](int64_t r, int64_t e) { return kept[static_cast<size_t>(r * e_ + e)]; };
  s.plan = kernels::moe_plan_limited(
      s.topk_idx, e_, std::vector<int64_t>(kept.begin() + me * e_, kept.begin() + (me + 1) * e_));
  s.send_rows.assign(static_cast<size_t>(n), 0);
  s.recv_rows.assign(static_cast<size_t>(n), 0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < e_local_; ++j) {
      s.send_rows[static_cast<size_t>(r)] += k_of(me, r * e_local_ + j);
      s.recv_rows[static_cast<size_t>(r)] += k_of(r, e_first_ + j);
    }
  }
  // Received rows are (source rank, local expert, token); the experts want
  // (local expert, source rank, token).
  std::vector<int64_t> recv_offset(static_cast<size_t>(n + 1), 0);
  for (int64_t r = 0; r < n; ++r)
    recv_offset[static_cast<size_t>(r + 1)] =
        recv_offset[static_cast<size_t>(r)] + s.recv_rows[static_cast<size_t>(r)];
  const int64_t total = recv_offset.back();
  kernels::MoePlan& x = s.exchange;
  x = kernels::MoePlan{};
  x.num_tokens = total;
  x.top_k = 1;
  x.num_experts = e_local_;
  x.offsets.assign(static_cast<size_t>(e_local_ + 1), 0);
  x.token_of_row.assign(static_cast<size_t>(total), 0);
  x.row_of_slot.assign(static_cast<size_t>(total), -1);
  int64_t row = 0;
  for (int64_t j = 0; j < e_local_; ++j) {
    x.offsets[static_cast<size_t>(j)] = row;
    for (int64_t r = 0; r < n; ++r) {
      int64_t base = recv_offset[static_cast<size_t>(r)];
      for (int64_t jj = 0; jj < j; ++jj) base += k_of(r, e_first_ + jj);
      for (int64_t i = 0; i < k_of(r, e_first_ + j); ++i, ++row) {
        x.token_of_row[static_cast<size_t>(row)] = static_cast<int32_t>(base + i);
        x.row_of_slot[static_cast<size_t>(base + i)] = static_cast<int32_t>(row);
      }
    }
  }
  x.offsets[static_cast<size_t>(e_local_)] = row;
}

Tensor MoeLayer::to_experts(kernels::Context& ctx, const Tensor& local_rows) {
  const Saved& s = saved_;
  const int64_t width = local_rows.dim(1);
  Tensor received = Tensor::empty({s.exchange.num_tokens, width}, local_rows.dtype(), MemTag::comm);
  ep_group_->alltoallv_async(local_rows, s.send_rows, received, s.recv_rows)->wait();
  Tensor out = Tensor::empty({s.exchange.num_tokens, width}, local_rows.dtype());
  kernels::moe_permute(ctx, received, s.exchange, out);
  return out;
}

Tensor MoeLayer::from_experts(kernels::Context& ctx, const Tensor& expert_rows) {
  const Saved& s = saved_;
  const int64_t width = expert_rows.dim(1);
  // With top_k = 1 the permutation's backward is the inverse scatter.
  Tensor by_source =
      Tensor::empty({s.exchange.num_tokens, width}, expert_rows.dtype(), MemTag::comm);
  kernels::moe_permute_backward(ctx, expert_rows, s.exchange, by_source);
  Tensor out = Tensor::empty({s.plan.rows(), width}, expert_rows.dtype());
  ep_group_->alltoallv_async(by_source, s.recv_rows, out, s.send_rows)->wait();
  return out;
}

Tensor MoeLayer::dispatch(kernels::Context& ctx, const Tensor& x) {
  const Saved& s = saved_;
  Tensor local = Tensor::empty({s.plan.rows(), d_}, prec_.compute);
  kernels::moe_permute(ctx, x, s.plan, local);
  return ep_size_ > 1 ? to_experts(ctx, local) : local;
}

}  // namespace moetron::nn
