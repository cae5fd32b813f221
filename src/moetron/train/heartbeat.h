// Per-rank heartbeats for `moetron launch`: each rank started by launch
// rewrites $MOETRON_LAUNCH_LOG_DIR/rank-R.heartbeat, one line
//
//   <step> <pid> <phase> <first>
//
// phase "start" as it starts training step <step> (step 0: the process
// started), "end" as it finishes one, "wait" while it is blocked in a
// collective during it (at most once a second, from the waiting thread
// through comm/wait_hook.h); <first> is the first training step this process
// started (0 before it has started one): a restarted rank resumed after
// step <first> - 1. Lines of the older "<step> <pid>" form still read (as
// phase "start"). The file is replaced by a rename, so a reader never sees
// half of one. Launch reads them to name a silent rank (no rank starts a
// step), a hung one (its heartbeat is stale while other ranks' are fresh:
// those wait for it in a collective and keep beating), and to time a
// restarted job's first step.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::train {

enum class HeartbeatPhase { start, end, wait };

// Writes this rank's heartbeat when launched by launch() (else nothing).
// Never throws: a heartbeat must not stop training.
void write_heartbeat(int rank, int64_t step, HeartbeatPhase phase = HeartbeatPhase::start) noexcept;

// Called once by a training process when it has its rank: writes the step-0
// heartbeat and, when launched by launch(), installs the communicators' wait
// hook (comm/wait_hook.h) that beats "wait" at most once a second while a
// collective blocks.
void start_heartbeats(int rank) noexcept;

// Seconds between two "wait" beats of one rank.
inline constexpr double kWaitBeatInterval = 1.0;

struct Heartbeat {
  int rank = 0;
  bool seen = false;  // the rank has written one
  int64_t step = -1;
  pid_t pid = 0;
  double age_s = 0;        // since it was written (or since `since_s` when never)
  char state = '?';        // /proc/PID/stat state: R, S, T (stopped), Z, ... '?' unknown
  std::string phase;       // "start", "end", "wait"
  int64_t first_step = 0;  // the first step this process started (0: none yet)
};

// Every rank's heartbeat in log_dir; a rank without one has age now - start.
std::vector<Heartbeat> read_heartbeats(const std::string& log_dir, int ranks, double started_s);

// The ranks to blame when no rank has stepped for a while: the stopped
// ones if any, else those at the lowest step, oldest first. One line each,
// e.g. "rank 1 (pid 4242) is stopped (SIGSTOP?): last step 3, 12 s ago".
std::vector<std::string> describe_silent_ranks(const std::vector<Heartbeat>& beats,
                                               std::vector<int>* blamed = nullptr);

// One line for a rank whose heartbeat went stale, e.g. "rank 1 (pid 4242)
// sent no heartbeat for 6 s (last: started step 3)".
std::string describe_stale_rank(const Heartbeat& beat);

// "SIGKILL" for 9 (or "signal 77" when it has no name).
std::string signal_name(int sig);

// Seconds on a monotonic clock (the heartbeats' ages are measured against it).
double now_seconds();

}  // namespace moetron::train
