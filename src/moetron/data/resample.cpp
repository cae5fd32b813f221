#include "moetron/data/resample.h"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <numeric>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

constexpr int kZeroCrossings = 16;
constexpr double kRolloff = 0.95;
constexpr double kKaiserBeta = 8.6;

// The filter taps of every phase: row p holds the weights of input samples
// floor(t) - half + 1 + j, j in [0, taps), for an output at t with frac(t) = p / phases.
struct PolyphaseFilter {
  int64_t phases = 0, taps = 0, half = 0;
  std::vector<float> weights;  // [phases, taps]
};

PolyphaseFilter make_filter(int src_rate, int dst_rate, int64_t phases) {
  // Cutoff in cycles per input sample.
  const double fc = 0.5 * kRolloff * std::min(src_rate, dst_rate) / src_rate;
  const double reach = kZeroCrossings / (2.0 * fc);  // filter half-length in input samples
  PolyphaseFilter f;
  f.phases = phases;
  f.half = static_cast<int64_t>(std::ceil(reach));
  f.taps = 2 * f.half;
  f.weights.resize(static_cast<size_t>(f.phases * f.taps));
  const double norm = std::cyl_bessel_i(0.0, kKaiserBeta);
  for (int64_t p = 0; p < f.phases; ++p) {
    const double frac = static_cast<double>(p) / static_cast<double>(f.phases);
    for (int64_t j = 0; j < f.taps; ++j) {
      const double x = static_cast<double>(j - f.half + 1) - frac;  // input minus output time
      if (std::abs(x) >= reach) continue;
      const double arg = 2.0 * std::numbers::pi * fc * x;
      const double sinc = x == 0 ? 1.0 : std::sin(arg) / arg;
      const double r = x / reach;
      const double window = std::cyl_bessel_i(0.0, kKaiserBeta * std::sqrt(1.0 - r * r)) / norm;
      f.weights[static_cast<size_t>(p * f.taps + j)] = static_cast<float>(2.0 * fc * sinc * window);
    }
  }
  return f;
}

}  // namespace

std::vector<float> resample(std::span<const float> src, int src_rate, int dst_rate) {
  MOETRON_CHECK(src_rate > 0 && dst_rate > 0, "resample: sample rates must be positive, got ",
                src_rate, " -> ", dst_rate);
  if (src_rate == dst_rate) return {src.begin(), src.end()};
  const int64_t g = std::gcd(src_rate, dst_rate);
  const int64_t up = dst_rate / g, down = src_rate / g;  // out n <-> in n * down / up
  const PolyphaseFilter f = make_filter(src_rate, dst_rate, up);
  const auto n_in = static_cast<int64_t>(src.size());
  const int64_t n_out = (n_in * up + down - 1) / down;
  std::vector<float> dst(static_cast<size_t>(n_out));
  for (int64_t n = 0; n < n_out; ++n) {
    const int64_t base = n * down / up;  // floor of the input time
    const int64_t phase = n * down % up;
    const float* w = f.weights.data() + phase * f.taps;
    const int64_t first = base - f.half + 1;
    double acc = 0;
    for (int64_t j = 0; j < f.taps; ++j) {
      const int64_t k = first + j;
      if (k >= 0 && k < n_in) acc += static_cast<double>(w[j]) * src[static_cast<size_t>(k)];
    }
    dst[static_cast<size_t>(n)] = static_cast<float>(acc);
  }
  return dst;
}

}  // namespace moetron::data
