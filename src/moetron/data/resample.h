// Sample-rate conversion for speech: espeak-ng speaks at its own rate
// (22050 Hz) and the audio encoder reads 16 kHz.
#pragma once

#include <span>
#include <vector>

namespace moetron::data {

// Band-limited resampling by a polyphase windowed-sinc filter: output sample
// n sits at input time n * src_rate / dst_rate (exact rational phase, one of
// dst_rate / gcd(src_rate, dst_rate) phases); the low-pass cutoff is 0.95 of
// the lower Nyquist frequency, the sinc is 16 zero crossings each side under
// a Kaiser window (beta 8.6, ~85 dB stopband), and samples outside the input
// count as 0. Output length ceil(src.size() * dst_rate / src_rate).
// Deterministic: the same input always gives the same bits.
std::vector<float> resample(std::span<const float> src, int src_rate, int dst_rate);

}  // namespace moetron::data
