// Preconditioned compression: the scales the reducer divides gradients by
// before encoding (grad_reducer.h explains why).
#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"
#include "moetron/parallel/grad_reducer.h"

namespace moetron::parallel {

void GradReducer::begin_preconditioner(float clamp) {
  precondition_clamp_ = clamp;
  for (Bucket& b : buckets_) {
    if (!b.scale.defined()) b.scale = Tensor::empty({b.numel}, DType::f32, MemTag::optimizer);
    b.scale.fill(0.0);
    b.slot_scale.assign(b.slots.size(), 0.0f);
  }
}

bool GradReducer::set_denominator(const std::string& param_name, int64_t offset, const Tensor& d) {
  for (Bucket& b : buckets_) {
    MOETRON_CHECK(b.scale.defined(), "set_denominator before begin_preconditioner");
    for (const BucketSlot& slot : b.slots) {
      if (slot.param->name != param_name) continue;
      MOETRON_CHECK(offset >= 0 && offset + d.numel() <= slot.numel, "denominator of '", param_name,
                    "' [", offset, ", ", offset + d.numel(), ") lies outside its ", slot.numel,
                    " elements");
      MOETRON_CHECK(d.dtype() == DType::f32, "denominator of '", param_name, "' must be f32");
      b.scale.slice(slot.offset + offset, slot.offset + offset + d.numel())
          .copy_from(d.reshape({d.numel()}));
      return true;
    }
  }
  return false;
}

const float* GradReducer::own_reduced_chunk(const Bucket& b) const {
  return opts_.mode == ReduceMode::reduce_scatter ? b.shard.data<float>()
                                                  : b.flat.data<float>() + dp_.rank() * b.chunk;
}

Tensor GradReducer::reduced_sums_of_squares(const Bucket& b) {
  const int64_t me = dp_.rank();
  const Tensor sumsq = Tensor::zeros({static_cast<int64_t>(b.slots.size())}, DType::f32);
  const float* g = own_reduced_chunk(b);
  for (size_t s = 0; s < b.slots.size(); ++s) {
    const BucketSlot& slot = b.slots[s];
    const int64_t lo = std::max(slot.offset, me * b.chunk),
                  hi = std::min(slot.offset + slot.numel, (me + 1) * b.chunk);
    double acc = 0;
    for (int64_t i = lo; i < hi; ++i) acc += double{g[i - me * b.chunk]} * g[i - me * b.chunk];
    sumsq.data<float>()[s] = static_cast<float>(acc);
  }
  dp_.allreduce(sumsq, comm::ReduceOp::sum);
  return sumsq;
}

void GradReducer::finish_preconditioner(const std::unordered_map<std::string, float>& saved,
                                        bool collective) {
  for (Bucket& b : buckets_) {
    // Sums of squares of the last reduced gradient, per slot, over this
    // rank's chunk, then over dp: the whole tensor's (only where needed).
    Tensor sumsq;
    if (collective) {
      dp_.allreduce(b.scale, comm::ReduceOp::max);
      sumsq = reduced_sums_of_squares(b);
    }
    float* d = b.scale.data<float>();
    for (size_t s = 0; s < b.slots.size(); ++s) {
      const BucketSlot& slot = b.slots[s];
      float* ds = d + slot.offset;
      // A parameter is either wholly AdamW's (every d > 0, eps included) or has no d.
      if (std::any_of(ds, ds + slot.numel, [](float x) { return x > 0; })) {
        MOETRON_CHECK(std::all_of(ds, ds + slot.numel, [](float x) { return x > 0; }),
                      "the preconditioner of '", slot.param->name,
                      "' covers only part of it: its optimizer state was not found whole over dp");
        continue;
      }
      const auto it = saved.find(slot.param->name);
      MOETRON_CHECK(collective || it != saved.end(), "no preconditioner scale for '",
                    slot.param->name, "' (neither a second moment on this rank nor a saved scale)");
      float rms = it != saved.end()
                      ? it->second
                      : std::sqrt(sumsq.data<float>()[s] / static_cast<float>(slot.numel));
      if (!(rms > 0) || !std::isfinite(rms)) rms = 1.0f;
      b.slot_scale[s] = rms;
      std::fill(ds, ds + slot.numel, rms);
    }
    // The padding (no parameter) is 0 everywhere and is sent as 0: any d will do.
    for (int64_t i = 0; i < b.numel; ++i) {
      if (!(d[i] > 0)) d[i] = 1.0f;
    }
  }
}

void GradReducer::floor_denominators(double share) {
  for (Bucket& b : buckets_) {
    MOETRON_CHECK(b.scale.defined(), "floor_denominators before finish_preconditioner");
    for (size_t s = 0; s < b.slots.size(); ++s) {
      if (b.slot_scale[s] > 0) continue;  // one scale per tensor: nothing to floor
      float* d = b.scale.data<float>() + b.slots[s].offset;
      const int64_t n = b.slots[s].numel;
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += d[i];
      const auto floor = static_cast<float>(share * sum / static_cast<double>(n));
      for (int64_t i = 0; i < n; ++i) d[i] = std::max(d[i], floor);
    }
  }
}

bool GradReducer::get_denominator(const std::string& param_name, int64_t offset,
                                  const Tensor& out) const {
  MOETRON_CHECK(out.dtype() == DType::f32, "denominator of '", param_name, "' is read as f32");
  for (const Bucket& b : buckets_) {
    for (const BucketSlot& slot : b.slots) {
      if (slot.param->name != param_name) continue;
      MOETRON_CHECK(b.scale.defined() && offset >= 0 && offset + out.numel() <= slot.numel,
                    "no denominator of '", param_name, "' at [", offset, ", ", offset + out.numel(),
                    ")");
      out.reshape({out.numel()})
          .copy_from(b.scale.slice(slot.offset + offset, slot.offset + offset + out.numel()));
      return true;
    }
  }
  return false;
}

std::unordered_map<std::string, float> GradReducer::tensor_scales() const {
  std::unordered_map<std::string, float> out;
  for (const Bucket& b : buckets_) {
    for (size_t s = 0; s < b.slot_scale.size(); ++s) {
      if (b.slot_scale[s] > 0) out[b.slots[s].param->name] = b.slot_scale[s];
    }
  }
  return out;
}

}  // namespace moetron::parallel
