// `moetron launch -n N -- train ...`: starts N ranks of this binary under
// OpenMPI's mpirun on this machine, one log per rank, and reports which rank
// failed. The ranks themselves detect mpirun and build the MPI world
// (comm::detect_launch_env); an error on one rank aborts them all.
#pragma once

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
};

// The mpirun command line launch() runs (argv[0] is the mpirun path), and
// the environment it adds. Pure: for tests and for `launch` to print.
struct LaunchPlan {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string run_dir;  // the command's --out: logs go to run_dir/logs/rank-R.log
  int threads_per_rank = 1;
  bool oversubscribed = false;
};
LaunchPlan plan_launch(const LaunchOptions& opts);

// Runs the plan: every rank's stdout and stderr go to RUN/logs/rank-R.log
// (mpirun's own messages to RUN/logs/mpirun.log); rank 0's also to this
// process's stdout / stderr. Returns 0 when every rank succeeded; otherwise
// prints to stderr which rank failed (and the signal that killed it, by
// name) and the last lines of its log, and returns mpirun's exit code (1 if
// that was 0). When no rank has started a step for opts.silent_timeout_s, it
// names the silent rank(s), stops the job and returns 1.
int launch(const LaunchOptions& opts);

// Set by launch() for every rank: the absolute RUN/logs directory.
inline constexpr const char* kLaunchLogDirEnv = "MOETRON_LAUNCH_LOG_DIR";

// Called by a failing rank before it aborts the job: writes `message` to
// $MOETRON_LAUNCH_LOG_DIR/rank-R.error when launched by launch() (else does
// nothing). mpirun can kill the job before it has forwarded the rank's last
// output; launch() reads these files after mpirun exits. Never throws.
void write_rank_error(int rank, const std::string& message) noexcept;

// The first "mpirun" (or `name`) on PATH that is executable; throws
// moetron::Error naming PATH when there is none.
std::string find_on_path(const std::string& name);

}  // namespace moetron::train
