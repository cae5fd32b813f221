// WAV files: 16-bit PCM mono, the speech of the ASR task exported for a
// person to listen to, and the audio `moetron generate --audio F.wav` reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::data {

// Mono audio: samples in [-1, 1] at sample_rate Hz.
struct Waveform {
  int sample_rate = 16000;
  std::vector<float> samples;
};

// Writes 16-bit PCM mono (samples clipped to [-1, 1], rounded to the nearest
// step of 1/32767). Throws moetron::Error naming the path.
void write_wav(const std::string& path, const Waveform& wave);

// Reads a RIFF/WAVE file of 16-bit PCM mono (chunks other than "fmt " and
// "data" are skipped). Throws moetron::Error naming the path and what is
// wrong: not RIFF/WAVE, no or short fmt chunk, a format other than PCM
// (1), more than one channel, other than 16 bits, no data chunk, or a
// data chunk longer than the file.
Waveform read_wav(const std::string& path);

}  // namespace moetron::data
