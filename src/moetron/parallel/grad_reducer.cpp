#include "moetron/parallel/grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "moetron/core/error.h"
#include "moetron/kernels/elementwise.h"

namespace moetron::parallel {

GradReducer::GradReducer(nn::ParameterSet& params, comm::Communicator& dp, ReducerOptions opts,
                         std::vector<BucketSpec> plan,
                         const std::function<bool(const nn::Parameter&)>& carries)
    : dp_(dp),
      opts_(opts),
      compress_from_(opts.start_on_request ? std::numeric_limits<int64_t>::max()
                                           : opts.warmup_steps + 1) {
  if (plan.empty()) plan = flat_bucket_plan(params, dp_.size(), opts_.bucket_bytes, carries);
  const int64_t n = dp_.size();
  size_t registered = 0;
  for (BucketSpec& spec : plan) {
    MOETRON_CHECK(spec.numel % n == 0, "bucket of ", spec.numel, " elements does not split over ",
                  n, " ranks");
    Bucket b;
    b.numel = spec.numel;
    b.chunk = spec.numel / n;
    for (const BucketSlot& slot : spec.slots) {
      // bf16 gradients (train.grad_dtype) are widened into the fp32 bucket
      // and rounded back after an all-reduce: the sum itself runs in fp32.
      const DType gd = slot.param->grad.dtype();
      MOETRON_CHECK(gd == DType::f32 || gd == DType::bf16,
                    "data parallelism reduces f32 or bf16 gradients; '", slot.param->name, "' has ",
                    dtype_name(gd));
      MOETRON_CHECK(slot.offset >= 0 && slot.offset + slot.numel <= spec.numel, "parameter '",
                    slot.param->name, "' lies outside its bucket");
      MOETRON_CHECK(
          where_.emplace(slot.param, std::make_pair(buckets_.size(), b.slots.size())).second,
          "parameter '", slot.param->name, "' is in two buckets");
      b.slots.push_back(slot);
      numel_ += slot.numel;
      ++registered;
    }
    b.flat = Tensor::zeros({b.numel}, DType::f32, MemTag::comm);
    if (opts_.mode == ReduceMode::reduce_scatter)
      b.shard = Tensor::zeros({b.chunk}, DType::f32, MemTag::comm);
    if (opts_.compress.kind != CompressKind::none) {
      const int64_t enc = encoded_bytes(opts_.compress, b.chunk);
      b.residual = Tensor::zeros({b.numel}, DType::f32, MemTag::optimizer);
      b.send = Tensor::zeros({n * enc}, DType::u8, MemTag::comm);
      b.recv = Tensor::zeros({n * enc}, DType::u8, MemTag::comm);
      if (opts_.mode == ReduceMode::allreduce) {
        b.residual2 = Tensor::zeros({b.chunk}, DType::f32, MemTag::optimizer);
        b.send2 = Tensor::zeros({enc}, DType::u8, MemTag::comm);
        b.recv2 = Tensor::zeros({n * enc}, DType::u8, MemTag::comm);
      }
    }
    buckets_.push_back(std::move(b));
  }
  size_t wanted = 0;
  for (const auto& p : params.all()) wanted += !carries || carries(*p);
  MOETRON_CHECK(registered == wanted, "bucket plan covers ", registered, " of the ", wanted,
                " parameters it should carry");
  pending_.assign(buckets_.size(), 0);
  work_.resize(buckets_.size());
}

int64_t GradReducer::padded_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.numel;
  return n;
}

namespace {

// v += residual; out = encode(v clamped to [-clamp, clamp] when clamp > 0);
// residual = v - decode(out), chunk by chunk: what the clamp holds back is
// owed like any other error. With a preconditioner d (nullptr: none), v is
// a gradient divided by d and the residual stays in the gradient's units
// (v += residual / d; residual = (v - decode(out)) * d), so what is owed
// keeps its meaning when d follows a live v from step to step. Returns the
// new residual's sum of squares.
double encode_with_feedback(const CompressOptions& o, float* v, float* residual, int64_t n,
                            uint8_t* out, const float* d = nullptr, float clamp = 0) {
  for (int64_t i = 0; i < n; ++i) v[i] += d ? residual[i] / d[i] : residual[i];
  if (clamp > 0) {
    // The old residual is in v now: its buffer holds the clamped values.
    for (int64_t i = 0; i < n; ++i) residual[i] = std::clamp(v[i], -clamp, clamp);
    encode(o, residual, n, out);
  } else {
    encode(o, v, n, out);
  }
  std::vector<float> sent(static_cast<size_t>(n), 0.0f);
  decode_add(o, out, n, sent.data());
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float owed = v[i] - sent[static_cast<size_t>(i)];
    residual[i] = d ? owed * d[i] : owed;
    sq += double{residual[i]} * residual[i];
  }
  return sq;
}

}  // namespace

std::vector<GradReducer::ResidualPiece> GradReducer::residual_pieces() {
  std::vector<ResidualPiece> out;
  const int64_t me = dp_.rank();
  for (Bucket& b : buckets_) {
    if (!b.residual.defined()) continue;
    for (const BucketSlot& slot : b.slots) {
      out.push_back(
          {slot.param, false, 0, b.residual.slice(slot.offset, slot.offset + slot.numel)});
      if (!b.residual2.defined()) continue;
      // This rank's chunk [me * chunk, (me + 1) * chunk) of the bucket.
      const int64_t lo = std::max(slot.offset, me * b.chunk);
      const int64_t hi = std::min(slot.offset + slot.numel, (me + 1) * b.chunk);
      if (lo < hi)
        out.push_back({slot.param, true, lo - slot.offset,
                       b.residual2.slice(lo - me * b.chunk, hi - me * b.chunk)});
    }
  }
  return out;
}

void GradReducer::finish_compressed(Bucket& b) {
  const int64_t n = dp_.size(), enc = encoded_bytes(opts_.compress, b.chunk);
  const Tensor sum = opts_.mode == ReduceMode::reduce_scatter
                         ? b.shard
                         : Tensor::empty({b.chunk}, DType::f32, MemTag::comm);
  sum.fill(0.0);
  for (int64_t j = 0; j < n; ++j)
    decode_add(opts_.compress, b.recv.data<uint8_t>() + j * enc, b.chunk, sum.data<float>());
  if (opts_.mode == ReduceMode::reduce_scatter) {
    if (b.scale.defined()) {
      const float* d = b.scale.data<float>() + dp_.rank() * b.chunk;
      float* y = sum.data<float>();
      for (int64_t i = 0; i < b.chunk; ++i) y[i] *= d[i];
    }
    return;
  }
  encode_with_feedback(opts_.compress, sum.data<float>(), b.residual2.data<float>(), b.chunk,
                       b.send2.data<uint8_t>(),
                       b.scale.defined() ? b.scale.data<float>() + dp_.rank() * b.chunk : nullptr);
  dp_.allgather(b.send2, b.recv2);
  b.flat.fill(0.0);
  for (int64_t j = 0; j < n; ++j) {
    decode_add(opts_.compress, b.recv2.data<uint8_t>() + j * enc, b.chunk,
               b.flat.data<float>() + j * b.chunk);
  }
  if (b.scale.defined()) {
    const float* d = b.scale.data<float>();
    float* y = b.flat.data<float>();
    for (int64_t i = 0; i < b.numel; ++i) y[i] *= d[i];
  }
}

void GradReducer::start(size_t b) {
  Bucket& bk = buckets_[b];
  if (compress_now_) {
    if (bk.scale.defined()) {
      const float* d = bk.scale.data<float>();
      float* x = bk.flat.data<float>();
      for (int64_t i = 0; i < bk.numel; ++i) x[i] /= d[i];
    }
    const int64_t enc = encoded_bytes(opts_.compress, bk.chunk);
    for (int64_t j = 0; j < dp_.size(); ++j) {
      const float* d = bk.scale.defined() ? bk.scale.data<float>() + j * bk.chunk : nullptr;
      residual_sq_ += encode_with_feedback(opts_.compress, bk.flat.data<float>() + j * bk.chunk,
                                           bk.residual.data<float>() + j * bk.chunk, bk.chunk,
                                           bk.send.data<uint8_t>() + j * enc, d,
                                           d ? precondition_clamp_ : 0.0f);
    }
    work_[b] = dp_.alltoall_async(bk.send, bk.recv);
    return;
  }
  if (opts_.mode == ReduceMode::allreduce) {
    work_[b] = dp_.allreduce_async(bk.flat, comm::ReduceOp::sum);
  } else {
    work_[b] = dp_.reduce_scatter_async(bk.flat, bk.shard, comm::ReduceOp::sum);
  }
}

void GradReducer::grad_ready(kernels::Context& ctx, nn::Parameter& p) {
  if (!armed_) return;
  const auto it = where_.find(&p);
  MOETRON_CHECK(it != where_.end(), "gradient reducer does not know parameter '", p.name, "'");
  const auto [b, s] = it->second;
  Bucket& bk = buckets_[b];
  if (pending_[b] == 0) pending_[b] = static_cast<int64_t>(bk.slots.size());
  const BucketSlot& slot = bk.slots[s];
  const Tensor dst = bk.flat.slice(slot.offset, slot.offset + slot.numel),
               src = p.grad.reshape({slot.numel});
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
  } else {
    kernels::convert(ctx, src, dst);
  }
  if (--pending_[b] == 0 && opts_.overlap) start(b);
  dp_.poll();
}

void GradReducer::finish(kernels::Context& ctx) {
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
    if (compress_now_) finish_compressed(buckets_[b]);
  }
  wait_seconds_ = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (opts_.mode == ReduceMode::allreduce) {
    for (Bucket& bk : buckets_) {
      for (const BucketSlot& slot : bk.slots) {
        const Tensor dst = slot.param->grad.reshape({slot.numel}),
                     src = bk.flat.slice(slot.offset, slot.offset + slot.numel);
        if (src.dtype() == dst.dtype()) {
          dst.copy_from(src);
        } else {
          kernels::convert(ctx, src, dst);
        }
      }
    }
  }
  armed_ = false;
}

}  // namespace moetron::parallel
