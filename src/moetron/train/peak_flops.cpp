#include "moetron/train/peak_flops.h"

#include <algorithm>
#include <chrono>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/matmul.h"

namespace moetron::train {

double measure_peak_flops(DType compute, int threads) {
  kernels::Context probe(kernels::Backend::cpu, threads);
  const int64_t n = 1024;
  Tensor a = Tensor::zeros({n, n}, compute, MemTag::workspace);
  Tensor b = Tensor::zeros({n, n}, compute, MemTag::workspace);
  Tensor c = Tensor::empty({n, n}, DType::f32, MemTag::workspace);
  a.fill(0.5);
  b.fill(0.25);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::matmul(probe, a, b, c, {});
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n * n * n) / best;
}

}  // namespace moetron::train
