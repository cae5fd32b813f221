#include "moetron/parallel/grad_reducer.h"

#include <chrono>

#include "moetron/core/error.h"

namespace moetron::parallel {

GradReducer::GradReducer(nn::ParameterSet& params, comm::Communicator& dp, ReducerOptions opts,
                         std::vector<BucketSpec> plan)
    : dp_(dp), opts_(opts) {
  if (plan.empty()) plan = flat_bucket_plan(params, dp_.size(), opts_.bucket_bytes);
  const int64_t n = dp_.size();
  size_t registered = 0;
  for (BucketSpec& spec : plan) {
    MOETRON_CHECK(spec.numel % n == 0, "bucket of ", spec.numel, " elements does not split over ", n, " ranks");
    Bucket b;
    b.numel = spec.numel;
    b.chunk = spec.numel / n;
    for (const BucketSlot& slot : spec.slots) {
      MOETRON_CHECK(slot.param->grad.dtype() == DType::f32, "data parallelism reduces f32 gradients; '",
                    slot.param->name, "' has ", dtype_name(slot.param->grad.dtype()));
      MOETRON_CHECK(slot.offset >= 0 && slot.offset + slot.numel <= spec.numel, "parameter '", slot.param->name,
                    "' lies outside its bucket");
      MOETRON_CHECK(where_.emplace(slot.param, std::make_pair(buckets_.size(), b.slots.size())).second,
                    "parameter '", slot.param->name, "' is in two buckets");
      b.slots.push_back(slot);
      numel_ += slot.numel;
      ++registered;
    }
    b.flat = Tensor::zeros({b.numel}, DType::f32, MemTag::comm);
    if (opts_.mode == ReduceMode::reduce_scatter) b.shard = Tensor::zeros({b.chunk}, DType::f32, MemTag::comm);
    buckets_.push_back(std::move(b));
  }
  MOETRON_CHECK(registered == params.all().size(), "bucket plan covers ", registered, " of ",
                params.all().size(), " parameters");
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
