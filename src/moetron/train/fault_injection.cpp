#include "moetron/train/fault_injection.h"

#include <signal.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "moetron/core/error.h"

namespace moetron::train {

namespace {

[[noreturn]] void malformed(const std::string& spec, const std::string& why) {
  MOETRON_FAIL(kInjectFailureEnv, "='", spec, "' is malformed: ", why,
               " (expected rank=R,step=S[,signal=KILL|STOP|SEGV] with integers R >= 0 and S >= 0)");
}

int64_t parse_int(const std::string& spec, const std::string& key, const std::string& text) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) {
    malformed(spec, key + " '" + text + "' is not an integer >= 0");
  }
  return v;
}

}  // namespace

std::optional<InjectedFailure> parse_injected_failure(const std::string& spec) {
  if (spec.empty()) return std::nullopt;
  std::optional<int64_t> rank, step;
  std::optional<std::string> signal;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(begin, end - begin);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) malformed(spec, "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "signal") {
      if (signal) malformed(spec, "'signal' given twice");
      if (value != "KILL" && value != "STOP" && value != "SEGV")
        malformed(spec, "signal '" + value + "' is not KILL, STOP or SEGV");
      signal = value;
      begin = end + 1;
      continue;
    }
    std::optional<int64_t>* slot = key == "rank" ? &rank : key == "step" ? &step : nullptr;
    if (slot == nullptr) malformed(spec, "unknown key '" + key + "'");
    if (slot->has_value()) malformed(spec, "'" + key + "' given twice");
    *slot = parse_int(spec, key, value);
    begin = end + 1;
  }
  if (!rank) malformed(spec, "'rank' is missing");
  if (!step) malformed(spec, "'step' is missing");
  if (*rank > INT32_MAX) malformed(spec, "rank " + std::to_string(*rank) + " is out of range");
  return InjectedFailure{static_cast<int>(*rank), *step, signal.value_or("")};
}

void maybe_fail_write(int, int64_t, const std::string&) {}

void maybe_inject_failure(int rank, int64_t step, FailurePoint at) {
  if (at != FailurePoint::step) return;
  const char* env = std::getenv(kInjectFailureEnv);
  if (env == nullptr) return;
  const auto f = parse_injected_failure(env);
  if (f && f->rank == rank && f->step == step) {
    if (!f->signal.empty()) {
      // As a crash or an operator would: the rank dies (or stops) without a word.
      std::fflush(stdout);
      std::fflush(stderr);
      ::raise(f->signal == "KILL" ? SIGKILL : f->signal == "STOP" ? SIGSTOP : SIGSEGV);
      return;  // continued after SIGSTOP: carry on
    }
    MOETRON_FAIL(kInjectFailureEnv, ": injected failure on rank ", rank, " at step ", step);
  }
}

}  // namespace moetron::train
