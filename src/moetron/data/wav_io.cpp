#include "moetron/data/wav_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

// WAV is little-endian; so is every machine this builds for (x86-64, aarch64).
void put_u32(std::string& s, uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), 4);
}
void put_u16(std::string& s, uint16_t v) {
  s.append(reinterpret_cast<const char*>(&v), 2);
}
uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
uint16_t get_u16(const std::string& s, size_t at) {
  uint16_t v;
  std::memcpy(&v, s.data() + at, 2);
  return v;
}

struct WavFormat {
  uint16_t format = 0, channels = 0, bits = 0;
  uint32_t rate = 0;
};

void check_format(const std::string& path, const WavFormat& f) {
  MOETRON_CHECK(f.format == 1, "WAV file '", path, "': audio format ", f.format, " is not PCM (1)");
  MOETRON_CHECK(f.channels == 1, "WAV file '", path, "' has ", f.channels,
                " channels; only mono is read");
  MOETRON_CHECK(f.bits == 16, "WAV file '", path, "' has ", f.bits,
                "-bit samples; only 16-bit PCM is read");
  MOETRON_CHECK(f.rate > 0, "WAV file '", path, "' has sample rate 0");
}

}  // namespace

void write_wav(const std::string& path, const Waveform& wave) {
  const auto data_bytes = static_cast<uint32_t>(wave.samples.size() * 2);
  std::string out;
  out.reserve(44 + data_bytes);
  out += "RIFF";
  put_u32(out, 36 + data_bytes);
  out += "WAVEfmt ";
  put_u32(out, 16);
  put_u16(out, 1);  // PCM
  put_u16(out, 1);  // mono
  put_u32(out, static_cast<uint32_t>(wave.sample_rate));
  put_u32(out, static_cast<uint32_t>(wave.sample_rate) * 2);  // bytes per second
  put_u16(out, 2);                                            // bytes per frame
  put_u16(out, 16);
  out += "data";
  put_u32(out, data_bytes);
  for (const float x : wave.samples) {
    const float c = std::clamp(x, -1.0f, 1.0f);
    put_u16(out, static_cast<uint16_t>(static_cast<int16_t>(std::lround(c * 32767.0f))));
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.flush();
  MOETRON_CHECK(f.good(), "cannot write WAV file '", path, "'");
}

Waveform read_wav(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOETRON_CHECK(in.good(), "cannot read WAV file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  MOETRON_CHECK(s.size() >= 12 && s.compare(0, 4, "RIFF") == 0 && s.compare(8, 4, "WAVE") == 0,
                "WAV file '", path, "' does not start with a RIFF/WAVE header");
  WavFormat fmt;
  bool have_fmt = false;
  size_t at = 12;
  while (at + 8 <= s.size()) {
    const std::string id = s.substr(at, 4);
    const uint32_t size = get_u32(s, at + 4);
    const size_t body = at + 8;
    if (id == "fmt ") {
      MOETRON_CHECK(size >= 16 && body + 16 <= s.size(), "WAV file '", path,
                    "' has a short fmt chunk (", size, " bytes)");
      fmt = {get_u16(s, body), get_u16(s, body + 2), get_u16(s, body + 14), get_u32(s, body + 4)};
      check_format(path, fmt);
      have_fmt = true;
    } else if (id == "data") {
      MOETRON_CHECK(have_fmt, "WAV file '", path, "' has its data chunk before a fmt chunk");
      MOETRON_CHECK(body + size <= s.size(), "WAV file '", path, "' is truncated: its data chunk ",
                    "declares ", size, " bytes, ", s.size() - body, " are present");
      MOETRON_CHECK(size % 2 == 0, "WAV file '", path, "' has an odd data size ", size);
      Waveform w;
      w.sample_rate = static_cast<int>(fmt.rate);
      w.samples.resize(size / 2);
      for (size_t i = 0; i < w.samples.size(); ++i)
        w.samples[i] =
            static_cast<float>(static_cast<int16_t>(get_u16(s, body + 2 * i))) / 32767.0f;
      return w;
    }
    at = body + size + (size & 1);  // chunks are padded to even sizes
  }
  MOETRON_FAIL("WAV file '", path, "' has no ", have_fmt ? "data" : "fmt", " chunk");
}

}  // namespace moetron::data
