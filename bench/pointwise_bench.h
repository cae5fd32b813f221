// Small helpers shared by the pointwise-kernel benchmarks (norm, activation,
// rope, embedding, adamw): random inputs and one record per timed case with
// seconds and effective bandwidth (bytes read + written / time).
#pragma once

#include <string>

#include "bench_util.h"
#include "moetron/core/rng.h"
#include "moetron/core/tensor.h"

namespace moetron::bench {

inline Tensor bench_random(const Shape& shape, DType dtype, const char* name, float lo = -1.0f,
                           float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype, MemTag::workspace);
  fill_uniform(t, 7, name, lo, hi);
  return t;
}

// Times fn and records name with labels shape/dtype and metrics seconds and
// gbytes_per_s for `bytes` moved per call.
template <typename Fn>
void time_bandwidth(Runner& runner, const std::string& name, const std::string& shape, DType dtype,
                    double bytes, Fn&& fn) {
  const double s = runner.time_median(fn, 0.3);
  Result r;
  r.name = name + "/" + std::string(dtype_name(dtype));
  r.labels["shape"] = shape;
  r.labels["dtype"] = std::string(dtype_name(dtype));
  r.metrics["seconds"] = s;
  r.metrics["gbytes_per_s"] = bytes / s * 1e-9;
  runner.record(std::move(r));
}

}  // namespace moetron::bench
