// Compute-thread setup. Denormal fp32 inputs slow oneDNN matmul on this class
// of CPU by ~50x, so every thread that computes runs with flush-to-zero and
// denormals-are-zero set.
#pragma once

namespace moetron {

// Sets FTZ/DAZ on the calling thread.
void set_flush_denormals_this_thread();
// Sets the OpenMP thread count (<= 0 keeps the current one) and FTZ/DAZ on the
// calling thread and on every thread of the OpenMP pool.
void init_compute_threads(int num_threads = 0);
int num_compute_threads();

}  // namespace moetron
