#include "moetron/data/log_mel.h"

#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numbers>

#include "moetron/core/error.h"
#include "moetron/data/resample.h"
#include "moetron/data/wav_io.h"

namespace moetron::data {

namespace {

// FFTW's planner is not thread-safe; executing a plan on new arrays is.
std::mutex& fftw_planner_mutex() {
  static std::mutex m;
  return m;
}

constexpr double kLinearMelPerHz = 3.0 / 200.0;  // Slaney: 200/3 Hz per mel below 1 kHz
constexpr double kBreakHz = 1000.0;
constexpr double kBreakMel = kBreakHz * kLinearMelPerHz;  // 15
const double kLogStep = std::log(6.4) / 27.0;             // mel step above 1 kHz

struct FftwBuffers {
  float* in = nullptr;
  fftwf_complex* out = nullptr;
  FftwBuffers(int64_t n_fft) {
    in = static_cast<float*>(fftwf_malloc(sizeof(float) * static_cast<size_t>(n_fft)));
    out = static_cast<fftwf_complex*>(
        fftwf_malloc(sizeof(fftwf_complex) * static_cast<size_t>(n_fft / 2 + 1)));
  }
  ~FftwBuffers() {
    fftwf_free(in);
    fftwf_free(out);
  }
  FftwBuffers(const FftwBuffers&) = delete;
  FftwBuffers& operator=(const FftwBuffers&) = delete;
};

}  // namespace

double hz_to_mel(double hz) {
  return hz < kBreakHz ? hz * kLinearMelPerHz : kBreakMel + std::log(hz / kBreakHz) / kLogStep;
}

double mel_to_hz(double mel) {
  return mel < kBreakMel ? mel / kLinearMelPerHz
                         : kBreakHz * std::exp((mel - kBreakMel) * kLogStep);
}

struct LogMel::Plan {
  fftwf_plan plan = nullptr;
  ~Plan() {
    std::lock_guard<std::mutex> lock(fftw_planner_mutex());
    if (plan) fftwf_destroy_plan(plan);
  }
};

LogMel::LogMel(const LogMelOptions& o) : opts_(o), plan_(std::make_unique<Plan>()) {
  MOETRON_CHECK(o.sample_rate > 0, "log-mel: sample_rate must be positive, got ", o.sample_rate);
  MOETRON_CHECK(o.win_length > 0 && o.win_length <= o.n_fft, "log-mel: win_length (", o.win_length,
                ") must be in [1, n_fft = ", o.n_fft, "]");
  MOETRON_CHECK(o.hop_length > 0, "log-mel: hop_length must be positive, got ", o.hop_length);
  MOETRON_CHECK(o.n_mels > 0, "log-mel: n_mels (--n-mels) must be positive, got ", o.n_mels);
  MOETRON_CHECK(o.f_min >= 0 && o.f_min < o.f_max && o.f_max <= o.sample_rate / 2.0,
                "log-mel: need 0 <= f_min < f_max <= sample_rate / 2, got ", o.f_min, ", ",
                o.f_max);
  window_.resize(static_cast<size_t>(o.win_length));
  for (int64_t i = 0; i < o.win_length; ++i)
    window_[static_cast<size_t>(i)] =
        static_cast<float>(0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * static_cast<double>(i) /
                                                static_cast<double>(o.win_length)));
  const double mel_lo = hz_to_mel(o.f_min), mel_hi = hz_to_mel(o.f_max);
  centers_hz_.resize(static_cast<size_t>(o.n_mels + 2));
  for (int64_t m = 0; m < o.n_mels + 2; ++m)
    centers_hz_[static_cast<size_t>(m)] = mel_to_hz(
        mel_lo + (mel_hi - mel_lo) * static_cast<double>(m) / static_cast<double>(o.n_mels + 1));
  const int64_t bins = o.n_fft / 2 + 1;
  filters_.assign(static_cast<size_t>(o.n_mels * bins), 0.0f);
  for (int64_t m = 0; m < o.n_mels; ++m) {
    const double lo = centers_hz_[static_cast<size_t>(m)];
    const double mid = centers_hz_[static_cast<size_t>(m + 1)];
    const double hi = centers_hz_[static_cast<size_t>(m + 2)];
    const double area_norm = 2.0 / (hi - lo);  // Slaney: each filter has unit area
    for (int64_t k = 0; k < bins; ++k) {
      const double f = static_cast<double>(k) * o.sample_rate / static_cast<double>(o.n_fft);
      const double w = std::max(0.0, std::min((f - lo) / (mid - lo), (hi - f) / (hi - mid)));
      filters_[static_cast<size_t>(m * bins + k)] = static_cast<float>(w * area_norm);
    }
  }
  FftwBuffers buf(o.n_fft);
  std::lock_guard<std::mutex> lock(fftw_planner_mutex());
  // FFTW_ESTIMATE: no timing measurements, so the plan (and the bits it
  // computes) is the same on every run.
  plan_->plan = fftwf_plan_dft_r2c_1d(static_cast<int>(o.n_fft), buf.in, buf.out, FFTW_ESTIMATE);
  MOETRON_CHECK(plan_->plan != nullptr, "FFTW could not plan a real FFT of size ", o.n_fft);
}

LogMel::~LogMel() = default;

std::vector<float> LogMel::compute(std::span<const float> samples) const {
  const auto n = static_cast<int64_t>(samples.size());
  const int64_t n_frames = frames(n), bins = opts_.n_fft / 2 + 1, half = opts_.win_length / 2;
  std::vector<float> out(static_cast<size_t>(n_frames * opts_.n_mels));
  std::vector<float> power(static_cast<size_t>(bins));
  FftwBuffers buf(opts_.n_fft);
  for (int64_t t = 0; t < n_frames; ++t) {
    std::fill(buf.in, buf.in + opts_.n_fft, 0.0f);
    for (int64_t i = 0; i < opts_.win_length; ++i) {
      const int64_t s = t * opts_.hop_length - half + i;
      if (s >= 0 && s < n)
        buf.in[i] = samples[static_cast<size_t>(s)] * window_[static_cast<size_t>(i)];
    }
    fftwf_execute_dft_r2c(plan_->plan, buf.in, buf.out);
    for (int64_t k = 0; k < bins; ++k)
      power[static_cast<size_t>(k)] = buf.out[k][0] * buf.out[k][0] + buf.out[k][1] * buf.out[k][1];
    for (int64_t m = 0; m < opts_.n_mels; ++m) {
      const float* w = filters_.data() + m * bins;
      double acc = 0;
      for (int64_t k = 0; k < bins; ++k)
        acc += static_cast<double>(w[k]) * power[static_cast<size_t>(k)];
      out[static_cast<size_t>(t * opts_.n_mels + m)] =
          static_cast<float>(std::log10(std::max(acc, 1e-10)));
    }
  }
  if (opts_.whisper_scaling && !out.empty()) {
    const float top = *std::max_element(out.begin(), out.end());
    for (float& x : out) x = (std::max(x, top - 8.0f) + 4.0f) / 4.0f;
  }
  return out;
}

std::vector<float> log_mel_of_wav(const std::string& path, const LogMelOptions& opts,
                                  int64_t* frames) {
  const Waveform wave = read_wav(path);
  const std::vector<float> samples = resample(wave.samples, wave.sample_rate, opts.sample_rate);
  const LogMel mel(opts);
  if (frames) *frames = mel.frames(static_cast<int64_t>(samples.size()));
  return mel.compute(samples);
}

}  // namespace moetron::data
