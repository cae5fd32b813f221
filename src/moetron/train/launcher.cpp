#include "moetron/train/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/train/heartbeat.h"
#include "moetron/train/launch_output.h"

namespace moetron::train {

namespace fs = std::filesystem;

namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string out_dir_of(const std::vector<std::string>& cmd) {
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == "--out" && i + 1 < cmd.size()) return cmd[i + 1];
    if (cmd[i].starts_with("--out=")) return cmd[i].substr(6);
  }
  return "";
}

}  // namespace

void write_rank_error(int rank, const std::string& message) noexcept {
  try {
    const char* dir = std::getenv(kLaunchLogDirEnv);
    if (dir == nullptr || *dir == 0) return;
    std::ofstream f(std::string(dir) + "/rank-" + std::to_string(rank) + ".error", std::ios::trunc);
    f << message << "\n";
  } catch (...) {
  }
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  const std::string p = path ? path : "";
  size_t begin = 0;
  while (begin <= p.size()) {
    size_t end = p.find(':', begin);
    if (end == std::string::npos) end = p.size();
    const std::string dir = end > begin ? p.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    begin = end + 1;
  }
  MOETRON_FAIL("launch: '", name, "' not found on PATH (", p,
               "); install OpenMPI (Debian: openmpi-bin) or put its bin directory on PATH");
}

LaunchPlan plan_launch(const LaunchOptions& opts) {
  MOETRON_CHECK(opts.ranks >= 1, "launch: -n must be >= 1, got ", opts.ranks);
  MOETRON_CHECK(opts.threads_per_rank >= 0,
                "launch: --threads-per-rank must be >= 0 (0: cores / ranks), got ",
                opts.threads_per_rank);
  MOETRON_CHECK(!opts.command.empty(),
                "launch: no command after `--` (e.g. -- train --config C --out RUN)");
  LaunchPlan plan;
  plan.run_dir = out_dir_of(opts.command);
  MOETRON_CHECK(!plan.run_dir.empty(),
                "launch: the command after `--` has no --out RUN; the per-rank logs go to ",
                "RUN/logs");
  const int cores = opts.cores > 0 ? opts.cores : usable_cores();
  plan.threads_per_rank =
      opts.threads_per_rank > 0 ? opts.threads_per_rank : std::max(1, cores / opts.ranks);
  plan.oversubscribed = opts.ranks > cores;
  const std::string t = std::to_string(plan.threads_per_rank);

  plan.argv = {opts.mpirun.empty() ? find_on_path("mpirun") : opts.mpirun, "-np",
               std::to_string(opts.ranks), "--tag-output"};
  if (!opts.hostfile.empty()) {
    MOETRON_CHECK(fs::is_regular_file(opts.hostfile), "launch: --hostfile '", opts.hostfile,
                  "' is not a file");
    plan.argv.insert(plan.argv.end(), {"--hostfile", fs::absolute(opts.hostfile).string()});
    plan.remote_hosts = true;
  }
  if (plan.oversubscribed) plan.argv.push_back("--oversubscribe");
  // mpirun binds each rank to one core by default: right for one thread per
  // rank on its own core, wrong for several threads or shared cores.
  if (plan.oversubscribed || plan.threads_per_rank > 1 ||
      opts.ranks * plan.threads_per_rank > cores) {
    plan.argv.insert(plan.argv.end(), {"--bind-to", "none"});
  }
  plan.argv.insert(plan.argv.end(), {"-x", "OMP_NUM_THREADS=" + t});
  plan.argv.insert(plan.argv.end(), {"-x", std::string(kLaunchLogDirEnv) + "=" +
                                               fs::absolute(plan.run_dir + "/logs").string()});
  if (opts.restarts > 0) {
    char at[32];
    std::snprintf(at, sizeof at, "%.3f", opts.failure_detected_at);
    plan.argv.insert(plan.argv.end(),
                     {"-x", std::string(kRestartsEnv) + "=" + std::to_string(opts.restarts)});
    plan.argv.insert(plan.argv.end(), {"-x", std::string(kFailureDetectedAtEnv) + "=" + at});
  }
  if (std::getenv("MOETRON_INJECT_FAILURE"))
    plan.argv.insert(plan.argv.end(), {"-x", "MOETRON_INJECT_FAILURE"});
  plan.argv.push_back(opts.program.empty() ? fs::read_symlink("/proc/self/exe").string()
                                           : opts.program);
  plan.argv.insert(plan.argv.end(), opts.command.begin(), opts.command.end());
  // The launcher owns the thread count: appended last, it overrides the config.
  if (opts.command[0] == "train")
    plan.argv.insert(plan.argv.end(), {"--set", "train.threads=" + t});
  if (::geteuid() == 0) {
    plan.env = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
  }
  return plan;
}

namespace {

constexpr double kStopGraceS = 5;  // SIGTERM to SIGKILL when stopping a job
constexpr int kPollMs = 100;       // how often should_stop is asked

// Forks mpirun with its stdout / stderr on the two pipes' write ends.
pid_t start_mpirun(const LaunchPlan& plan, int out_fd, int err_fd) {
  std::vector<std::string> args = plan.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  MOETRON_CHECK(pid >= 0, "launch: fork: ", std::strerror(errno));
  if (pid == 0) {
    // mpirun (and with it every rank) ends if the launcher dies.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    for (const auto& [k, v] : plan.env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(argv[0], argv.data());
    const std::string msg =
        std::string("launch: cannot run ") + argv[0] + ": " + std::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
    ::_exit(127);
  }
  return pid;
}

// Fields of /proc/PID/stat after "pid (comm)": [0] state, [1] ppid, ...,
// [19] start time (empty when the process is gone).
std::vector<std::string> proc_stat(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::vector<std::string> fields;
  if (!std::getline(f, stat)) return fields;
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return fields;
  std::istringstream rest(stat.substr(paren + 1));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

// Stops a job: stopped ranks cannot act on SIGTERM and are killed at once;
// mpirun (which forwards to its ranks) and this machine's ranks get SIGTERM,
// then SIGKILL after the grace. Ranks are found by their heartbeats' pids
// while they are mpirun's children, and signalled only while the pid is
// still that process (same start time: a pid may be reused).
class JobStopper {
 public:
  JobStopper(pid_t mpirun, const LaunchPlan& plan, int ranks) : mpirun_(mpirun) {
    if (plan.remote_hosts) return;
    for (const Heartbeat& h : read_heartbeats(plan.run_dir + "/logs", ranks, now_seconds())) {
      const auto st = h.seen && h.pid > 0 ? proc_stat(h.pid) : std::vector<std::string>{};
      if (st.size() > 19 && st[1] == std::to_string(mpirun))
        ranks_.push_back({h.pid, st[19], st[0] == "T" || st[0] == "t"});
    }
  }
  void begin() {
    started_ = now_seconds();
    for (const Rank& r : ranks_) ::kill(r.pid, r.stopped ? SIGKILL : SIGTERM);
    ::kill(mpirun_, SIGTERM);
  }
  // SIGKILL to what is left once the grace is over.
  void tick() {
    if (killed_ || now_seconds() - started_ < kStopGraceS) return;
    killed_ = true;
    kill_ranks();  // before mpirun: its orphans would outlive it
    ::kill(mpirun_, SIGKILL);
  }
  // After mpirun has exited: no rank it started may outlive the attempt.
  void finish() {
    kill_ranks();
    const double until = now_seconds() + kStopGraceS;
    for (const Rank& r : ranks_) {
      while (running(r) && now_seconds() < until) ::usleep(10000);
    }
  }

 private:
  struct Rank {
    pid_t pid;
    std::string start_time;
    bool stopped;
  };
  // Still that process and not a zombie (a zombie has let go of everything).
  static bool running(const Rank& r) {
    const auto st = proc_stat(r.pid);
    return st.size() > 19 && st[19] == r.start_time && st[0] != "Z";
  }
  void kill_ranks() {
    for (const Rank& r : ranks_) {
      if (running(r)) ::kill(r.pid, SIGKILL);
    }
  }
  pid_t mpirun_;
  std::vector<Rank> ranks_;
  double started_ = 0;
  bool killed_ = false;
};

}  // namespace

AttemptRun run_attempt(const LaunchPlan& plan, int ranks, OutputRouter& router,
                       const std::function<bool()>& should_stop) {
  int out_pipe[2], err_pipe[2];
  MOETRON_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
                "launch: pipe: ", std::strerror(errno));
  const pid_t mpirun = start_mpirun(plan, out_pipe[1], err_pipe[1]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  std::unique_ptr<JobStopper> stopper;
  while (open_fds > 0) {
    const int ready = ::poll(fds, 2, kPollMs);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; ready > 0 && i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        router.feed(i, buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
    if (stopper) {
      stopper->tick();
    } else if (should_stop()) {
      stopper = std::make_unique<JobStopper>(mpirun, plan, ranks);
      stopper->begin();
    }
  }
  for (const pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  router.flush();
  int status = 0;
  while (::waitpid(mpirun, &status, 0) < 0 && errno == EINTR) {
  }
  if (stopper) stopper->finish();
  AttemptRun run;
  run.stopped = stopper != nullptr;
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace moetron::train
