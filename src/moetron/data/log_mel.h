// Log-mel spectrogram features for the audio encoder, computed with FFTW
// (fftw3f, real-to-complex). The same function serves the data generator and
// `moetron generate --audio F.wav`, so a WAV file becomes exactly the
// features the model was trained on.
//
// The formula (Whisper's front end, with n_fft zero-padded to a power of 2):
//   frame t (t = 0 .. frames-1, frames = 1 + samples / hop) is the samples
//     [t*hop - win/2, t*hop + win/2) (zeros outside the signal), times a
//     periodic Hann window w[i] = 0.5 - 0.5 cos(2 pi i / win);
//   power[k]  = |FFT_n_fft(frame)[k]|^2, k = 0 .. n_fft/2;
//   mel[m]    = sum_k filter[m][k] * power[k], Slaney-scale triangular filters
//               between f_min and f_max with Slaney area normalisation
//               (librosa's default, as Whisper uses);
//   log[m]    = log10(max(mel[m], 1e-10));
//   with whisper_scaling (default): out = (max(log, max_over_clip(log) - 8) + 4) / 4,
//   which keeps 80 dB of dynamic range and puts values near [-1, 1].
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moetron::data {

struct LogMelOptions {
  int sample_rate = 16000;
  int64_t win_length = 400;  // 25 ms
  int64_t hop_length = 160;  // 10 ms
  int64_t n_fft = 512;
  int64_t n_mels = 80;
  double f_min = 0, f_max = 8000;
  bool whisper_scaling = true;
};

// Holds the FFT plan, window and filter bank; compute() may be called from
// several threads at once (plans are made under a lock, executed on per-call
// buffers).
class LogMel {
 public:
  explicit LogMel(const LogMelOptions& opts);  // throws naming a bad option
  ~LogMel();
  LogMel(const LogMel&) = delete;
  LogMel& operator=(const LogMel&) = delete;

  // Features [frames(n), n_mels] row-major of samples at opts.sample_rate.
  std::vector<float> compute(std::span<const float> samples) const;
  int64_t frames(int64_t n_samples) const { return 1 + n_samples / opts_.hop_length; }
  // Centre frequency in Hz of mel filter m (its peak).
  double center_hz(int64_t m) const { return centers_hz_[static_cast<size_t>(m + 1)]; }
  const LogMelOptions& options() const { return opts_; }

 private:
  struct Plan;
  LogMelOptions opts_;
  std::vector<float> window_;
  std::vector<double> centers_hz_;  // n_mels + 2 filter edges
  std::vector<float> filters_;      // [n_mels, n_fft/2 + 1]
  std::unique_ptr<Plan> plan_;
};

// The features of a WAV file (16-bit PCM mono, data/wav_io.h) as the ASR
// generator computes them: resampled to opts.sample_rate when its rate
// differs (data/resample.h), then LogMel::compute. Sets *frames. Throws
// naming the file when it is not a readable WAV.
std::vector<float> log_mel_of_wav(const std::string& path, const LogMelOptions& opts,
                                  int64_t* frames);

// Slaney mel scale (linear below 1 kHz, logarithmic above), as librosa's
// default; exposed for tests.
double hz_to_mel(double hz);
double mel_to_hz(double mel);

}  // namespace moetron::data
