// The MFU denominator: the peak GEMM rate of the dtype we train in,
// measured on this machine (a 1024^3 matmul, best of four).
#pragma once

#include "moetron/core/dtype.h"

namespace moetron::train {

// FLOP/s of one rank with `threads` OpenMP threads (0: all). Runs in its own
// kernels::Context: a bf16 GEMM widened to fp32 (no native bf16 matmul)
// grows a context's scratch to 8 MiB, which training's context must not keep.
double measure_peak_flops(DType compute, int threads);

}  // namespace moetron::train
