// The MFU denominator: the peak GEMM rate of the dtype we train in,
// measured on this machine (a 1024^3 matmul: one warm-up, then the best of
// kPeakProbes timed runs, so a probe that lands in a noisy moment does not
// lower the peak and lift MFU above what the machine can do).
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/core/dtype.h"

namespace moetron::train {

inline constexpr int kPeakProbes = 10;

// FLOP/s of one rank with `threads` OpenMP threads (0: all). Runs in its own
// kernels::Context: a bf16 GEMM widened to fp32 (no native bf16 matmul)
// grows a context's scratch to 8 MiB, which training's context must not keep.
double measure_peak_flops(DType compute, int threads);

// The peak rate from the probes' seconds for `flops` each: the fastest one.
double peak_from_probes(const std::vector<double>& seconds, double flops);

// Model FLOPs utilisation of `ranks` ranks, each with peak `peak_flops`,
// in [0, 1]. The probe is the best of several runs, so a rate above it is
// measurement noise (or a model faster than the probe GEMM): it is reported
// as 1, never above 100%.
double model_flops_utilization(double tokens_per_s, double flops_per_token, double peak_flops,
                               int64_t ranks);

}  // namespace moetron::train
