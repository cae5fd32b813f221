// `moetron launch -n N -- train ...`: starts N ranks of this binary under
// OpenMPI's mpirun on this machine, one log per rank, and reports which rank
// failed. The ranks themselves detect mpirun and build the MPI world
// (comm::detect_launch_env); an error on one rank aborts them all. With
// --max-restarts K it supervises the job (train/supervisor.cpp): a failed or
// hung attempt is stopped and the whole job relaunched with --resume, up to
// K times (OpenMPI 4.1 has no ULFM: surviving ranks cannot continue without
// the lost one); with --min-ranks it shrinks and grows with the ranks
// available (train/supervisor_policy.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace moetron::train {

struct LaunchOptions {
  int ranks = 1;
  int threads_per_rank = 0;  // 0: max(1, cores / ranks)
  std::vector<std::string>
      command;          // moetron arguments after `--`, e.g. {"train", "--config", ...}
  std::string program;  // the moetron binary the ranks run (default: this executable)
  std::string mpirun;   // default: `mpirun` found on PATH
  int cores = 0;        // 0: the CPUs this process may run on
  // OpenMPI hostfile ("host slots=N" lines): the ranks run on those hosts
  // (the run directory must be on a filesystem they all share); empty: here.
  std::string hostfile;
  // Seconds without any rank starting a training step (train/heartbeat.h)
  // before launch names the silent rank(s) and stops the job; 0: never.
  int silent_timeout_s = 600;
  // Seconds a rank's heartbeat may be stale while another rank's is fresh
  // before launch calls it hung and stops the attempt; 0: never. Ranks
  // blocked in a collective keep beating, so only the rank they wait for
  // goes stale; local work without collectives longer than this on one rank
  // (while others wait) would be mistaken for a hang.
  int heartbeat_timeout_s = 300;
  // Failed or hung attempts relaunched (with --resume) before launch gives
  // up; 0: report the failure and stop.
  int max_restarts = 0;
  // Elastic when > 0: before each new attempt the ranks listed in
  // RUN/logs/unavailable are dropped (giving up below min_ranks), and a
  // RUN/logs/capacity above the running count asks the job to stop for a
  // resize (RUN/logs/stop-request) and relaunches it larger.
  int min_ranks = 0;
  // Set by the supervisor on a relaunch: the restarts so far and when the
  // failure that caused this one was detected (seconds since the epoch; 0:
  // a resize, no failure). Passed to the ranks as MOETRON_RESTARTS and
  // MOETRON_FAILURE_DETECTED_AT (train/trainer_recovery.cpp reads them).
  int restarts = 0;
  double failure_detected_at = 0;
};

// The mpirun command line launch() runs (argv[0] is the mpirun path), and
// the environment it adds. Pure: for tests and for `launch` to print.
struct LaunchPlan {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string run_dir;  // the command's --out: logs go to run_dir/logs/rank-R.log
  int threads_per_rank = 1;
  bool oversubscribed = false;
  bool remote_hosts = false;  // --hostfile: rank pids are not this machine's
};
LaunchPlan plan_launch(const LaunchOptions& opts);

// Runs the job (train/supervisor.cpp): every rank's stdout and stderr go to
// RUN/logs/rank-R.log (mpirun's own messages to RUN/logs/mpirun.log); rank
// 0's also to this process's stdout / stderr. Returns 0 when every rank
// succeeded; otherwise prints to stderr which rank failed (and the signal
// that killed it, by name) and the last lines of its log, and returns
// mpirun's exit code (1 if that was 0). When no rank has started a step for
// opts.silent_timeout_s, or one rank is hung (opts.heartbeat_timeout_s), it
// names them, stops the job and returns 1. With opts.max_restarts it
// relaunches instead, and returns non-zero only when it gives up. Every
// failure, restart, recovery and resize is a line of RUN/events.jsonl.
int launch(const LaunchOptions& opts);

class OutputRouter;

// One attempt: mpirun started on `plan`, its output routed through
// `router` until it exits. `should_stop` is asked about every 0.1 s; when
// it says yes, the job is stopped: SIGKILL at once to stopped ranks, SIGTERM
// to mpirun and to this machine's ranks, SIGKILL to them after a short
// grace; returns once mpirun and those ranks are gone.
struct AttemptRun {
  int code = 0;          // mpirun's exit code; 128 + signal when a signal ended it
  bool stopped = false;  // should_stop asked for the stop
};
AttemptRun run_attempt(const LaunchPlan& plan, int ranks, OutputRouter& router,
                       const std::function<bool()>& should_stop);

// Set by launch() for every rank: the absolute RUN/logs directory.
inline constexpr const char* kLaunchLogDirEnv = "MOETRON_LAUNCH_LOG_DIR";
inline constexpr const char* kRestartsEnv = "MOETRON_RESTARTS";
inline constexpr const char* kFailureDetectedAtEnv = "MOETRON_FAILURE_DETECTED_AT";

// Called by a failing rank before it aborts the job: writes `message` to
// $MOETRON_LAUNCH_LOG_DIR/rank-R.error when launched by launch() (else does
// nothing). mpirun can kill the job before it has forwarded the rank's last
// output; launch() reads these files after mpirun exits. Never throws.
void write_rank_error(int rank, const std::string& message) noexcept;

// The first "mpirun" (or `name`) on PATH that is executable; throws
// moetron::Error naming PATH when there is none.
std::string find_on_path(const std::string& name);

}  // namespace moetron::train
