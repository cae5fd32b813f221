#include "moetron/train/peak_flops.h"

#include <algorithm>
#include <chrono>

#include "moetron/core/error.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/matmul.h"

namespace moetron::train {

double peak_from_probes(const std::vector<double>& seconds, double flops) {
  MOETRON_CHECK(!seconds.empty(), "peak_from_probes: no probes");
  const double best = *std::min_element(seconds.begin(), seconds.end());
  MOETRON_CHECK(best > 0, "peak_from_probes: a probe took no time");
  return flops / best;
}

double measure_peak_flops(DType compute, int threads) {
  kernels::Context probe(kernels::Backend::cpu, threads);
  const int64_t n = 1024;
  Tensor a = Tensor::zeros({n, n}, compute, MemTag::workspace);
  Tensor b = Tensor::zeros({n, n}, compute, MemTag::workspace);
  Tensor c = Tensor::empty({n, n}, DType::f32, MemTag::workspace);
  a.fill(0.5);
  b.fill(0.25);
  kernels::matmul(probe, a, b, c, {});  // warm-up: first-touch pages, oneDNN's primitive cache
  std::vector<double> seconds;
  for (int i = 0; i < kPeakProbes; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::matmul(probe, a, b, c, {});
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return peak_from_probes(seconds, 2.0 * static_cast<double>(n * n * n));
}

double model_flops_utilization(double tokens_per_s, double flops_per_token, double peak_flops,
                               int64_t ranks) {
  if (peak_flops <= 0 || ranks <= 0) return 0;
  const double mfu = tokens_per_s * flops_per_token / (peak_flops * static_cast<double>(ranks));
  return std::clamp(mfu, 0.0, 1.0);
}

}  // namespace moetron::train
