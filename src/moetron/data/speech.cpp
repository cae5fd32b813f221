#include "moetron/data/speech.h"

#include <espeak-ng/speak_lib.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>

#include "moetron/core/error.h"
#include "moetron/data/resample.h"

namespace moetron::data {

namespace {

constexpr float kSilence = 1e-3f;
constexpr double kKeepSilenceSeconds = 0.05;

std::mutex& espeak_mutex() {
  static std::mutex m;
  return m;
}

// Called by espeak_Synth with each block of samples; appends them to the
// vector passed as user_data. Returns 0 to continue synthesis.
int collect_samples(short* wav, int n, espeak_EVENT* events) {
  auto* out = static_cast<std::vector<short>*>(events->user_data);
  if (wav && n > 0) out->insert(out->end(), wav, wav + n);
  return 0;
}

// Initialises espeak-ng once; returns its sample rate. Caller holds the lock.
int ensure_initialised() {
  static int rate = 0;
  if (rate > 0) return rate;
  rate = espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, nullptr, espeakINITIALIZE_DONT_EXIT);
  MOETRON_CHECK(rate > 0, "cannot initialise espeak-ng (is espeak-ng-data installed?)");
  espeak_SetSynthCallback(collect_samples);
  return rate;
}

constexpr int kChildNoVoice = 3, kChildSynthFailed = 4, kChildCrashed = 5;

// Runs in a child forked from a process that initialised espeak-ng but never
// spoke: espeak-ng keeps state between utterances in function statics
// (pitch flutter position, wave phase, echo buffer), so speaking in a fresh
// copy of that state makes each utterance a pure function of its text and
// style. Writes the 16-bit samples to `fd` and exits.
[[noreturn]] void synthesise_in_child(int fd, const std::string& text, const SpeechStyle& style) {
  if (espeak_SetVoiceByName(style.voice.c_str()) != EE_OK) ::_exit(kChildNoVoice);
  espeak_SetParameter(espeakRATE, style.rate_wpm, 0);
  espeak_SetParameter(espeakPITCH, style.pitch, 0);
  espeak_SetParameter(espeakRANGE, style.range, 0);
  std::vector<short> pcm;
  if (espeak_Synth(text.c_str(), text.size() + 1, 0, POS_CHARACTER, 0, espeakCHARS_UTF8, nullptr,
                   &pcm) != EE_OK ||
      espeak_Synchronize() != EE_OK)
    ::_exit(kChildSynthFailed);
  const char* at = reinterpret_cast<const char*>(pcm.data());
  size_t left = pcm.size() * sizeof(short);
  while (left > 0) {
    const ssize_t n = ::write(fd, at, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(kChildCrashed);
    at += n;
    left -= static_cast<size_t>(n);
  }
  ::_exit(0);
}

void trim_silence(Waveform& w) {
  auto& s = w.samples;
  const auto keep = static_cast<int64_t>(kKeepSilenceSeconds * w.sample_rate);
  int64_t first = 0, last = static_cast<int64_t>(s.size()) - 1;
  while (first <= last && std::abs(s[static_cast<size_t>(first)]) < kSilence) ++first;
  while (last >= first && std::abs(s[static_cast<size_t>(last)]) < kSilence) --last;
  if (first > last) return;  // all silence: keep it as it is
  first = std::max<int64_t>(0, first - keep);
  last = std::min<int64_t>(static_cast<int64_t>(s.size()) - 1, last + keep);
  s = std::vector<float>(s.begin() + first, s.begin() + last + 1);
}

}  // namespace

const std::vector<std::string>& speech_voices() {
  static const std::vector<std::string> voices = {
      "en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-us+f3", "en+f2", "en-us+m3"};
  return voices;
}

SpeechStyle random_speech_style(PhiloxStream& rng) {
  SpeechStyle s;
  s.voice = speech_voices()[rng.next_u32() % speech_voices().size()];
  s.rate_wpm = 140 + static_cast<int>(rng.next_u32() % 71);
  s.pitch = 30 + static_cast<int>(rng.next_u32() % 41);
  s.range = 30 + static_cast<int>(rng.next_u32() % 41);
  return s;
}

int speech_native_rate() {
  std::lock_guard<std::mutex> lock(espeak_mutex());
  return ensure_initialised();
}

Waveform speak_native(const std::string& text, const SpeechStyle& style) {
  MOETRON_CHECK(style.rate_wpm >= espeakRATE_MINIMUM && style.rate_wpm <= espeakRATE_MAXIMUM,
                "speech rate ", style.rate_wpm, " wpm is outside [", espeakRATE_MINIMUM, ", ",
                espeakRATE_MAXIMUM, "]");
  std::lock_guard<std::mutex> lock(espeak_mutex());
  const int rate = ensure_initialised();
  int fds[2];
  MOETRON_CHECK(::pipe(fds) == 0, "speech: cannot make a pipe: ", std::strerror(errno));
  const pid_t child = ::fork();
  MOETRON_CHECK(child >= 0, "speech: cannot fork: ", std::strerror(errno));
  if (child == 0) {
    ::close(fds[0]);
    synthesise_in_child(fds[1], text, style);
  }
  ::close(fds[1]);
  std::string bytes;
  char buf[1 << 16];
  ssize_t got = 0;
  while ((got = ::read(fds[0], buf, sizeof(buf))) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    bytes.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  MOETRON_CHECK(WIFEXITED(status) && WEXITSTATUS(status) != kChildCrashed,
                "espeak-ng crashed speaking '", text, "'");
  MOETRON_CHECK(WEXITSTATUS(status) != kChildNoVoice, "espeak-ng has no voice '", style.voice, "'");
  MOETRON_CHECK(WEXITSTATUS(status) == 0 && bytes.size() % 2 == 0, "espeak-ng failed to speak '",
                text, "' (status ", WEXITSTATUS(status), ")");
  Waveform w;
  w.sample_rate = rate;
  w.samples.resize(bytes.size() / 2);
  for (size_t i = 0; i < w.samples.size(); ++i) {
    int16_t v;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    w.samples[i] = static_cast<float>(v) / 32768.0f;
  }
  trim_silence(w);
  return w;
}

Waveform speak(const std::string& text, const SpeechStyle& style, int sample_rate) {
  Waveform native = speak_native(text, style);
  Waveform out;
  out.sample_rate = sample_rate;
  out.samples = resample(native.samples, native.sample_rate, sample_rate);
  return out;
}

}  // namespace moetron::data
