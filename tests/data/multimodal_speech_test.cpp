// Speech from espeak-ng: deterministic, at the asked rate, of a plausible length.
#include <gtest/gtest.h>

#include <cmath>

#include "moetron/core/error.h"
#include "moetron/data/speech.h"

namespace moetron::data {
namespace {

TEST(Speech, SameTextAndStyleGiveTheSameSamples) {
  SpeechStyle style;
  style.voice = "en-gb-x-rp";
  style.rate_wpm = 160;
  style.pitch = 40;
  const Waveform a = speak("the cat sat on the mat", style);
  SpeechStyle other;
  other.voice = "en-us+f3";
  speak("something else entirely, spoken first", other);
  const Waveform b = speak("the cat sat on the mat", style);
  EXPECT_EQ(a.sample_rate, 16000);
  ASSERT_EQ(a.samples.size(), b.samples.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.samples.size(); ++i) differing += a.samples[i] != b.samples[i];
  EXPECT_EQ(differing, 0u);
}

TEST(Speech, SoundsForAPlausibleTimeAndIsNotSilent) {
  PhiloxStream rng(1, "speech");
  for (int n = 0; n < 4; ++n) {
    const SpeechStyle style = random_speech_style(rng);
    const Waveform w = speak("well begun is half done", style);
    const double seconds = static_cast<double>(w.samples.size()) / w.sample_rate;
    EXPECT_GT(seconds, 0.6) << style.voice;
    EXPECT_LT(seconds, 3.0) << style.voice;
    double energy = 0;
    for (const float x : w.samples) energy += x * x;
    EXPECT_GT(std::sqrt(energy / w.samples.size()), 0.01) << style.voice;
  }
  SpeechStyle bad;
  bad.voice = "no-such-voice";
  EXPECT_THROW(speak("hello", bad), Error);
}

}  // namespace
}  // namespace moetron::data
