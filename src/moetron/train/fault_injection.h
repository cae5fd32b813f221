// Fault injection for tests of rank failure: MOETRON_INJECT_FAILURE="rank=R,step=S"
// makes rank R throw moetron::Error at the start of training step S (step 0:
// at startup, before the trainer is built); ",signal=KILL" (or STOP, SEGV)
// makes it raise that signal instead, as a crash or a stopped process would. Parsed in this one
// place; a malformed value is an error that names the variable, on every rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moetron::train {

struct InjectedFailure {
  int rank = 0;
  int64_t step = 0;
  std::string signal;  // "KILL", "STOP", "SEGV": raise it instead of throwing
};

inline constexpr const char* kInjectFailureEnv = "MOETRON_INJECT_FAILURE";

// "rank=R,step=S[,signal=KILL|STOP|SEGV]" (keys in any order; rank and step
// required, integers >= 0).
// Empty text: no failure. Throws moetron::Error naming kInjectFailureEnv.
std::optional<InjectedFailure> parse_injected_failure(const std::string& spec);

// Throws moetron::Error("... injected failure on rank R at step S") when the
// environment asks for a failure of this rank at this step; re-reads the
// variable on every call (no global state), a getenv and a few compares.
enum class FailurePoint { step, snapshot, persist };
void maybe_inject_failure(int rank, int64_t step, FailurePoint at = FailurePoint::step);
// Throws when a disk-full failure of this rank is armed (placeholder until
// the supervisor's failure kinds land).
void maybe_fail_write(int rank, int64_t step, const std::string& path);

}  // namespace moetron::train
