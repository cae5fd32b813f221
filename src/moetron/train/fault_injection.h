// Fault injection for tests of rank failure and recovery. MOETRON_INJECT_FAILURE
// holds a ';'-separated list of failures, each
//
//   rank=R,step=S[,kind=K][,at=P][,seconds=X]      (keys in any order)
//
// K: error (default: throw moetron::Error), kill (SIGKILL itself), hang (the
// calling thread sleeps forever and sends no heartbeat, as a deadlock would),
// exit (_exit(1) without a word), slow (from step S on, sleep X seconds at
// the start of every step: a straggler), disk-full (the first checkpoint or
// snapshot write of rank R at a step >= S fails as ENOSPC would; with
// at=snapshot only a snapshot write, with at=persist only a checkpoint
// write), stop (SIGSTOP itself), segv (SIGSEGV itself).
// P: step (default: the start of step S; step 0 is start-up, before the
// trainer is built), snapshot (during step S's in-memory snapshot), persist
// (during the disk write of step S's checkpoint). slow takes only at=step;
// seconds (> 0) goes with slow and only with it.
// The older "rank=R,step=S,signal=KILL|STOP|SEGV" means kind=kill|stop|segv.
//
// Under `moetron launch` (MOETRON_LAUNCH_LOG_DIR set) each failure fires once
// per job, across restarts: just before failure i (0-based, in list order)
// fires, its rank creates RUN/logs/injected-<i>, and a failure whose marker
// exists is skipped (launch removes the markers when it starts). Without
// launch, a one-shot kind fires whenever its rank reaches its step and
// point; a disk-full failure fires once per process. Parsed in this one
// place; a malformed value is an error that names the variable, on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::train {

enum class FailurePoint { step, snapshot, persist };

enum class FailureKind { error, kill, hang, exit, slow, disk_full, stop, segv };

struct InjectedFailure {
  int index = 0;  // position in the list: names its marker file
  int rank = 0;
  int64_t step = 0;
  FailureKind kind = FailureKind::error;
  FailurePoint at = FailurePoint::step;
  double seconds = 0;  // slow: the sleep per step
};

inline constexpr const char* kInjectFailureEnv = "MOETRON_INJECT_FAILURE";

// Empty text: no failure. Throws moetron::Error naming kInjectFailureEnv,
// the failure's position and the problem.
std::vector<InjectedFailure> parse_injected_failures(const std::string& spec);

// "kill", "disk-full", ...; "step", "snapshot", "persist".
std::string failure_kind_name(FailureKind kind);
std::string failure_point_name(FailurePoint at);

// Fires the failures of this rank armed for this step and point (slow ones
// for every step from theirs on, at FailurePoint::step). Throws
// moetron::Error("... injected failure on rank R at step S") for kind
// error. Re-reads the variable on every call: a getenv and a short parse.
void maybe_inject_failure(int rank, int64_t step, FailurePoint at = FailurePoint::step);

// Throws moetron::Error("... No space left on device (injected ...)") once
// when a disk-full failure of this rank is armed at a step <= step for this
// kind of write (`what`: snapshot or persist; a failure at=step takes
// either) and has not fired yet. Called just before a checkpoint (persist)
// or snapshot write to `path`.
void maybe_fail_write(int rank, int64_t step, const std::string& path, FailurePoint what);

}  // namespace moetron::train
