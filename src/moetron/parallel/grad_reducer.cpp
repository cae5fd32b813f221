#include "moetron/parallel/grad_reducer.h"

#include <chrono>

#include "moetron/core/error.h"

namespace moetron::parallel {

GradReducer::GradReducer(nn::ParameterSet& params, comm::Communicator& dp, ReducerOptions opts)
    : dp_(dp), opts_(opts) {
  MOETRON_CHECK(opts_.bucket_bytes > 0, "gradient bucket size must be positive, got ", opts_.bucket_bytes);
  const auto& all = params.all();
  const int64_t n = dp_.size();
  Bucket cur;
  auto close = [&] {
    if (cur.slots.empty()) return;
    cur.numel = (cur.numel + n - 1) / n * n;
    cur.chunk = cur.numel / n;
    cur.flat = Tensor::zeros({cur.numel}, DType::f32, MemTag::comm);
    if (opts_.mode == ReduceMode::reduce_scatter) cur.shard = Tensor::zeros({cur.chunk}, DType::f32, MemTag::comm);
    buckets_.push_back(std::move(cur));
    cur = Bucket{};
  };
  for (size_t i = all.size(); i-- > 0;) {
    nn::Parameter* p = all[i].get();
    MOETRON_CHECK(p->grad.dtype() == DType::f32, "data parallelism reduces f32 gradients; '", p->name,
                  "' has ", dtype_name(p->grad.dtype()));
    where_[p] = {buckets_.size(), cur.slots.size()};
    cur.slots.push_back({p, cur.numel, p->grad.numel()});
    cur.numel += p->grad.numel();
    numel_ += p->grad.numel();
    if (cur.numel * 4 >= opts_.bucket_bytes) close();
  }
  close();
  pending_.assign(buckets_.size(), 0);
  work_.resize(buckets_.size());
}

int64_t GradReducer::padded_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.numel;
  return n;
}

void GradReducer::start(size_t b) {
  Bucket& bk = buckets_[b];
  if (opts_.mode == ReduceMode::allreduce) {
    work_[b] = dp_.allreduce_async(bk.flat, comm::ReduceOp::sum);
  } else {
    work_[b] = dp_.reduce_scatter_async(bk.flat, bk.shard, comm::ReduceOp::sum);
  }
}

void GradReducer::grad_ready(kernels::Context& /*ctx*/, nn::Parameter& p) {
  if (!armed_) return;
  const auto it = where_.find(&p);
  MOETRON_CHECK(it != where_.end(), "gradient reducer does not know parameter '", p.name, "'");
  const auto [b, s] = it->second;
  Bucket& bk = buckets_[b];
  if (pending_[b] == 0) pending_[b] = static_cast<int64_t>(bk.slots.size());
  const BucketSlot& slot = bk.slots[s];
  bk.flat.slice(slot.offset, slot.offset + slot.numel).copy_from(p.grad.reshape({slot.numel}));
  if (--pending_[b] == 0 && opts_.overlap) start(b);
  dp_.poll();
}

void GradReducer::finish(kernels::Context& /*ctx*/) {
  MOETRON_CHECK(armed_, "gradient reducer finished without an armed backward");
  for (size_t b = 0; b < buckets_.size(); ++b) {
    MOETRON_CHECK(pending_[b] == 0, "bucket ", b, " is missing ", pending_[b],
                  " gradients at the end of backward (a parameter never reported ready)");
  }
  using clock_type = std::chrono::steady_clock;
  const auto t0 = clock_type::now();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!work_[b]) start(b);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    work_[b]->wait();
    work_[b].reset();
  }
  wait_seconds_ = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (opts_.mode == ReduceMode::allreduce) {
    for (Bucket& bk : buckets_) {
      for (const BucketSlot& slot : bk.slots) {
        slot.param->grad.reshape({slot.numel}).copy_from(bk.flat.slice(slot.offset, slot.offset + slot.numel));
      }
    }
  }
  armed_ = false;
}

}  // namespace moetron::parallel
