// Speech for the ASR task: text spoken by espeak-ng (its library, in
// synchronous mode: samples arrive through a callback) with a varied
// English voice, speed and pitch, resampled to 16 kHz (data/resample.h).
//
// espeak-ng keeps global state, so every call goes through one
// process-wide lock, and the library is initialised once per process. It
// also carries state from one utterance to the next (function statics:
// pitch flutter position, wave phase), so each utterance is spoken in a
// child process forked from the initialised, never-speaking parent: the
// samples are then a pure function of (text, voice, rate, pitch, range),
// whatever was spoken before (tests/data/multimodal_speech_test.cpp). The
// fork costs about a millisecond; call it from one thread at a time while
// no other thread of the process holds a lock the child would need (the
// data generator is single-threaded).
#pragma once

#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/data/wav_io.h"

namespace moetron::data {

struct SpeechStyle {
  std::string voice = "en-us";  // an espeak-ng voice name, optionally "+variant"
  int rate_wpm = 175;           // words per minute, [80, 450]
  int pitch = 50;               // 0-100
  int range = 50;               // pitch range, 0-100
};

// English voices and variants used for the ASR task.
const std::vector<std::string>& speech_voices();
// A voice from speech_voices(), rate in [140, 210] wpm, pitch in [30, 70],
// range in [30, 70].
SpeechStyle random_speech_style(PhiloxStream& rng);

// `text` (UTF-8) spoken in `style`, at espeak-ng's native rate
// (speech_native_rate(), usually 22050 Hz), leading and trailing silence
// trimmed to 50 ms. Throws moetron::Error when espeak-ng cannot be
// initialised, the voice is unknown, or synthesis fails.
Waveform speak_native(const std::string& text, const SpeechStyle& style);
int speech_native_rate();

// speak_native resampled to `sample_rate`.
Waveform speak(const std::string& text, const SpeechStyle& style, int sample_rate = 16000);

}  // namespace moetron::data
