// Per-rank heartbeats for `moetron launch`: each rank started by launch
// rewrites $MOETRON_LAUNCH_LOG_DIR/rank-R.heartbeat ("<step> <pid>") at the
// start of every training step; launch reads them to name a rank that went
// silent (stopped, hung, or dead without a word) instead of waiting forever.
// Deliberately small: the supervisor (restart, elastic resize) builds on it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::train {

// Writes this rank's heartbeat when launched by launch() (else nothing).
// Never throws: a heartbeat must not stop training.
void write_heartbeat(int rank, int64_t step) noexcept;

struct Heartbeat {
  int rank = 0;
  bool seen = false;  // the rank has written one
  int64_t step = -1;
  pid_t pid = 0;
  double age_s = 0;  // since it was written (or since `since_s` when never)
  char state = '?';  // /proc/PID/stat state: R, S, T (stopped), Z, ... '?' unknown
};

// Every rank's heartbeat in log_dir; a rank without one has age now - start.
std::vector<Heartbeat> read_heartbeats(const std::string& log_dir, int ranks, double started_s);

// The ranks to blame when no rank has stepped for a while: the stopped
// ones if any, else those at the lowest step, oldest first. One line each,
// e.g. "rank 1 (pid 4242) is stopped (SIGSTOP?): last step 3, 12 s ago".
std::vector<std::string> describe_silent_ranks(const std::vector<Heartbeat>& beats,
                                               std::vector<int>* blamed = nullptr);

// "SIGKILL" for 9 (or "signal 77" when it has no name).
std::string signal_name(int sig);

// Seconds on a monotonic clock (the heartbeats' ages are measured against it).
double now_seconds();

}  // namespace moetron::train
