// The audio front end: resampling, log-mel features, WAV files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "moetron/core/error.h"
#include "moetron/data/log_mel.h"
#include "moetron/data/resample.h"
#include "moetron/data/wav_io.h"

namespace moetron::data {
namespace {

namespace fs = std::filesystem;

std::vector<float> sine(double hz, int rate, int64_t n, double amplitude = 0.5) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] =
        static_cast<float>(amplitude * std::sin(2.0 * std::numbers::pi * hz * i / rate));
  return x;
}

// Frequency of a tone by counting upward zero crossings (away from the edges).
double tone_frequency(const std::vector<float>& x, int rate) {
  const size_t lo = x.size() / 4, hi = 3 * x.size() / 4;
  size_t first = 0, last = 0, crossings = 0;
  for (size_t i = lo; i + 1 < hi; ++i) {
    if (x[i] <= 0 && x[i + 1] > 0) {
      if (crossings == 0) first = i;
      last = i;
      ++crossings;
    }
  }
  return static_cast<double>(crossings - 1) * rate / static_cast<double>(last - first);
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("moetron_mm_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(Resample, KeepsAToneFrequencyAndAmplitude) {
  const auto x = sine(440.0, 22050, 22050);
  const auto y = resample(x, 22050, 16000);
  ASSERT_EQ(y.size(), 16000u);
  EXPECT_NEAR(tone_frequency(y, 16000), 440.0, 1.0);
  float peak = 0;
  for (size_t i = 4000; i < 12000; ++i) peak = std::max(peak, std::abs(y[i]));
  EXPECT_NEAR(peak, 0.5, 0.01);
  // Sample-exact against the analytic tone in the middle (the filter is linear phase).
  const auto want = sine(440.0, 16000, 16000);
  for (size_t i = 4000; i < 12000; i += 97) EXPECT_NEAR(y[i], want[i], 2e-3) << i;
}

TEST(Resample, RemovesToneAboveTheNewNyquist) {
  // 10 kHz is representable at 22050 Hz but above 8 kHz: it must not alias to 6 kHz.
  const auto y = resample(sine(10000.0, 22050, 22050), 22050, 16000);
  float peak = 0;
  for (size_t i = 4000; i < 12000; ++i) peak = std::max(peak, std::abs(y[i]));
  EXPECT_LT(peak, 0.005);
}

TEST(LogMel, SinePeaksInTheMelBinOfItsFrequency) {
  LogMelOptions o;
  o.n_mels = 40;
  LogMel mel(o);
  for (const double hz : {300.0, 1000.0, 2500.0, 6000.0}) {
    const auto feat = mel.compute(sine(hz, 16000, 8000));
    ASSERT_EQ(static_cast<int64_t>(feat.size()), mel.frames(8000) * 40);
    EXPECT_EQ(mel.frames(8000), 51);
    const int64_t t = 25;  // a frame in the middle
    int64_t best = 0;
    for (int64_t m = 1; m < 40; ++m)
      if (feat[t * 40 + m] > feat[t * 40 + best]) best = m;
    int64_t nearest = 0;
    for (int64_t m = 1; m < 40; ++m)
      if (std::abs(mel.center_hz(m) - hz) < std::abs(mel.center_hz(nearest) - hz)) nearest = m;
    EXPECT_LE(std::abs(best - nearest), 1) << hz << " Hz peaked in bin " << best;
    EXPECT_GT(feat[t * 40 + best], 0.5f) << "the loudest values scale near 1";
  }
}

TEST(LogMel, SilenceIsTheFloorAndScalingFollowsWhisper) {
  LogMelOptions o;
  o.n_mels = 8;
  o.whisper_scaling = false;
  LogMel mel(o);
  const auto feat = mel.compute(std::vector<float>(1600, 0.0f));
  ASSERT_EQ(feat.size(), 11u * 8u);
  for (const float v : feat) EXPECT_FLOAT_EQ(v, -10.0f);  // log10(1e-10)
  EXPECT_NEAR(mel_to_hz(hz_to_mel(3456.0)), 3456.0, 1e-9);
  EXPECT_NEAR(hz_to_mel(1000.0), 15.0, 1e-12);
  o.n_mels = 0;
  EXPECT_THROW(LogMel{o}, Error);
}

TEST(Wav, RoundTripsSixteenBitPcm) {
  Waveform w;
  w.sample_rate = 16000;
  w.samples = sine(220.0, 16000, 1234, 0.9);
  w.samples[5] = 1.5f;  // clipped to 1
  const std::string path = temp_path("round.wav");
  write_wav(path, w);
  const Waveform r = read_wav(path);
  EXPECT_EQ(r.sample_rate, 16000);
  ASSERT_EQ(r.samples.size(), w.samples.size());
  for (size_t i = 0; i < r.samples.size(); ++i)
    EXPECT_NEAR(r.samples[i], std::clamp(w.samples[i], -1.0f, 1.0f), 1.0 / 32767) << i;
  fs::remove(path);
}

TEST(LogMel, WavFileGivesTheFeaturesOfItsSamples) {
  LogMelOptions o;
  o.n_mels = 24;
  const LogMel mel(o);
  Waveform w;
  w.sample_rate = 16000;
  w.samples = sine(1500.0, 16000, 4000);
  const std::string path = temp_path("feat.wav");
  write_wav(path, w);
  int64_t frames = 0;
  const auto from_file = log_mel_of_wav(path, o, &frames);
  EXPECT_EQ(frames, mel.frames(4000));
  const auto direct = mel.compute(read_wav(path).samples);
  EXPECT_EQ(from_file, direct);
  // At another rate the file is resampled first: the same tone, the same bin.
  w.sample_rate = 22050;
  w.samples = sine(1500.0, 22050, 5512);
  write_wav(path, w);
  const auto resampled = log_mel_of_wav(path, o, &frames);
  EXPECT_EQ(frames, mel.frames(4000));
  auto peak = [](const std::vector<float>& f, int64_t t) {
    return std::max_element(f.begin() + t * 24, f.begin() + (t + 1) * 24) - (f.begin() + t * 24);
  };
  EXPECT_EQ(peak(resampled, 12), peak(direct, 12));
  fs::remove(path);
}

void expect_error_naming(const std::string& path, const std::string& part) {
  try {
    read_wav(path);
    ADD_FAILURE() << "reading " << path << " did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Wav, BadHeadersAreErrorsNamingTheFile) {
  Waveform w;
  w.samples = sine(220.0, 16000, 100);
  const std::string path = temp_path("bad.wav");
  write_wav(path, w);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto rewrite = [&](std::string b) { std::ofstream(path, std::ios::binary) << b; };
  std::string b = bytes;
  b[0] = 'X';
  rewrite(b);
  expect_error_naming(path, "RIFF/WAVE");
  b = bytes;
  b[22] = 2;  // stereo
  rewrite(b);
  expect_error_naming(path, "channels");
  b = bytes;
  b[34] = 8;  // 8-bit
  rewrite(b);
  expect_error_naming(path, "16-bit");
  rewrite(bytes.substr(0, bytes.size() - 10));
  expect_error_naming(path, "truncated");
  expect_error_naming(temp_path("missing.wav"), "cannot read");
  fs::remove(path);
}

}  // namespace
}  // namespace moetron::data
