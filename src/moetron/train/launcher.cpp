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
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "moetron/core/error.h"
#include "moetron/train/heartbeat.h"

namespace moetron::train {

namespace fs = std::filesystem;

namespace {

constexpr size_t kTailLines = 10;

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

// mpirun --tag-output puts "[J,R]<stdout>:" (or <stderr>) before every chunk
// a rank wrote and after every newline inside one, so a tag can also appear
// in the middle of a line (a rank writes "rank 1: " and "error: ..." in two
// calls; another rank's chunk lands after a line without its newline).
// Parses a tag at `p`: 1 and sets rank / is_stderr / length when there is
// one, 0 when there is none, -1 when `s` ends before that can be decided.
int parse_tag(const std::string& s, size_t p, int& rank, bool& is_stderr, size_t& length) {
  size_t i = p + 1;
  auto digits = [&](size_t& q) {
    const size_t start = q;
    while (q < s.size() && ::isdigit(static_cast<unsigned char>(s[q]))) ++q;
    return q - start;
  };
  if (digits(i) == 0) return i >= s.size() ? -1 : 0;
  if (i >= s.size()) return -1;
  if (s[i++] != ',') return 0;
  const size_t rank_at = i;
  if (digits(i) == 0) return i >= s.size() ? -1 : 0;
  const size_t rank_len = i - rank_at;
  for (const char* tail : {"]<stdout>:", "]<stderr>:"}) {
    const size_t n = std::strlen(tail);
    const size_t have = std::min(n, s.size() - i);
    if (s.compare(i, have, tail, have) != 0) continue;
    if (have < n) return -1;
    rank = std::stoi(s.substr(rank_at, rank_len));
    is_stderr = tail[3] == 'e';
    length = i + n - p;
    return 1;
  }
  return 0;
}

// The rank an mpirun message blames, or -1.
int rank_in_mpirun_message(const std::string& line) {
  for (const char* marker :
       {"MPI_ABORT was invoked on rank ", "process rank ", "Process name: [["}) {
    const size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    size_t p = at + std::strlen(marker);
    if (std::strcmp(marker, "Process name: [[") == 0) {  // "Process name: [[J,S],R]"
      p = line.find("],", p);
      if (p == std::string::npos) continue;
      p += 2;
    }
    size_t q = p;
    while (q < line.size() && ::isdigit(static_cast<unsigned char>(line[q]))) ++q;
    if (q > p) return std::stoi(line.substr(p, q - p));
  }
  return -1;
}

// The signal an mpirun message says a rank died of ("... exited on signal 9
// (Killed)."), or -1.
int signal_in_mpirun_message(const std::string& line) {
  const char* marker = "exited on signal ";
  const size_t at = line.find(marker);
  if (at == std::string::npos) return -1;
  size_t p = at + std::strlen(marker), q = p;
  while (q < line.size() && ::isdigit(static_cast<unsigned char>(line[q]))) ++q;
  return q > p ? std::stoi(line.substr(p, q - p)) : -1;
}

// Splits mpirun's two output pipes into lines per rank and stream, and
// routes each line: to RUN/logs/rank-R.log, rank 0's also to the console,
// mpirun's own (untagged) lines to RUN/logs/mpirun.log. A carriage return
// (progress lines: mpirun gives ranks a pty) also ends a line.
class OutputRouter {
 public:
  // `header` starts this launch's part of every log (logs are appended).
  OutputRouter(std::string log_dir, std::string header)
      : log_dir_(std::move(log_dir)), header_(std::move(header)) {
    mpirun_log_.open(log_dir_ + "/mpirun.log", std::ios::app);
    MOETRON_CHECK(mpirun_log_.good(), "cannot write '", log_dir_, "/mpirun.log'");
    mpirun_log_ << header_ << "\n" << std::flush;
  }
  void feed(int pipe, const char* data, size_t n) {
    Pipe& pp = pipes_[pipe];
    pp.raw.append(data, n);
    size_t i = 0;
    while (i < pp.raw.size()) {
      const char c = pp.raw[i];
      if (c == '[') {
        int rank = 0;
        bool is_stderr = false;
        size_t len = 0;
        const int tag = parse_tag(pp.raw, i, rank, is_stderr, len);
        if (tag < 0) break;  // wait for the rest of the tag
        if (tag > 0) {
          pp.owner = {rank, is_stderr};
          i += len;
          continue;
        }
      }
      if (c == '\n' || c == '\r') {
        std::string& line = pending_[pp.owner];
        if (c == '\n' || !line.empty()) emit(pp.owner, line);
        line.clear();
        if (c == '\n') pp.owner = kMpirun;
      } else {
        pending_[pp.owner].push_back(c);
      }
      ++i;
    }
    pp.raw.erase(0, i);
  }
  void flush() {
    for (auto& [owner, line] : pending_) {
      if (!line.empty()) emit(owner, line);
      line.clear();
    }
  }
  // Errors the ranks wrote to RUN/logs/rank-R.error (write_rank_error), oldest
  // first: the rank and its message join the failures and its log, unless
  // mpirun forwarded the line before the job was killed.
  void add_error_files() {
    std::vector<std::pair<fs::file_time_type, fs::path>> files;
    for (const auto& e : fs::directory_iterator(log_dir_)) {
      if (e.path().extension() == ".error" && e.path().stem().string().starts_with("rank-")) {
        files.emplace_back(fs::last_write_time(e.path()), e.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& [when, path] : files) {
      const std::string digits = path.stem().string().substr(5);
      if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
      const int rank = std::stoi(digits);
      std::ifstream f(path);
      std::string line;
      while (std::getline(f, line)) {
        const auto& t = tails_[rank];
        if (std::find(t.begin(), t.end(), line) == t.end()) emit({rank, true}, line);
        mark_failed(rank);  // it wrote an error file: it failed, whatever mpirun forwarded
      }
    }
  }
  // Every rank gets its log (with the header) even if it never prints.
  void open_rank_logs(int ranks) {
    for (int r = 0; r < ranks; ++r) rank_log(r).flush();
  }
  const std::vector<int>& failed_ranks() const { return failed_; }
  int blamed_by_mpirun() const { return blamed_; }
  int signal_by_mpirun() const { return signal_; }
  const std::deque<std::string>& tail(int rank) { return tails_[rank]; }
  const std::deque<std::string>& mpirun_tail() { return mpirun_tail_; }
  std::string log_path(int rank) const {
    return log_dir_ + "/rank-" + std::to_string(rank) + ".log";
  }

 private:
  using Owner = std::pair<int, bool>;  // rank (-1: mpirun itself), stderr
  static constexpr Owner kMpirun{-1, true};
  struct Pipe {
    std::string raw;
    Owner owner = kMpirun;
  };

  void emit(const Owner& owner, std::string line) {
    // Drop the terminal's erase-to-end-of-line that progress lines end with.
    for (size_t at; (at = line.find("\033[K")) != std::string::npos;) line.erase(at, 3);
    const auto [rank, is_stderr] = owner;
    if (rank < 0) {
      mpirun_log_ << line << "\n" << std::flush;
      push(mpirun_tail_, line);
      if (blamed_ < 0) blamed_ = rank_in_mpirun_message(line);
      if (signal_ < 0) signal_ = signal_in_mpirun_message(line);
      return;
    }
    rank_log(rank) << line << "\n" << std::flush;
    push(tails_[rank], line);
    if (rank == 0) (is_stderr ? std::cerr : std::cout) << line << std::endl;
    // On either stream: mpirun's forwarding under abort is not careful about which.
    if (line.starts_with("rank " + std::to_string(rank) + ": error:")) mark_failed(rank);
  }
  void mark_failed(int rank) {
    if (std::find(failed_.begin(), failed_.end(), rank) == failed_.end()) failed_.push_back(rank);
  }
  static void push(std::deque<std::string>& q, const std::string& l) {
    q.push_back(l);
    if (q.size() > kTailLines) q.pop_front();
  }
  std::ofstream& rank_log(int rank) {
    auto it = logs_.find(rank);
    if (it != logs_.end()) return *it->second;
    auto f = std::make_unique<std::ofstream>(log_path(rank), std::ios::app);
    MOETRON_CHECK(f->good(), "cannot write '", log_path(rank), "'");
    *f << header_ << "\n";
    return *logs_.emplace(rank, std::move(f)).first->second;
  }
  std::string log_dir_, header_;
  std::ofstream mpirun_log_;
  std::map<int, Pipe> pipes_;
  std::map<Owner, std::string> pending_;
  std::map<int, std::unique_ptr<std::ofstream>> logs_;
  std::map<int, std::deque<std::string>> tails_;
  std::deque<std::string> mpirun_tail_;
  std::vector<int> failed_;
  int blamed_ = -1;
  int signal_ = -1;
};

void print_tail(const std::string& title, const std::deque<std::string>& lines) {
  std::cerr << title << "\n";
  for (const auto& l : lines) std::cerr << "  | " << l << "\n";
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

// No rank has started a step for the timeout: name the silent ones and stop
// the job (a stopped rank cannot act on SIGTERM: it is killed outright).
void stop_silent_job(pid_t mpirun, const std::vector<Heartbeat>& beats, int timeout_s) {
  std::cerr << "launch: no rank has started a training step for " << timeout_s
            << " s (--silent-timeout); silent:\n";
  std::vector<int> blamed;
  for (const auto& line : describe_silent_ranks(beats, &blamed)) std::cerr << "  " << line << "\n";
  std::cerr << "launch: stopping the job" << std::endl;
  for (const auto& h : beats) {
    if (h.seen && (h.state == 'T' || h.state == 't')) ::kill(h.pid, SIGKILL);
  }
  ::kill(mpirun, SIGTERM);
}

// Routes mpirun's output until both pipes close; checks the heartbeats
// every second. Returns true when it stopped a silent job.
bool pump_output(OutputRouter& router, int out_fd, int err_fd, pid_t mpirun,
                 const LaunchOptions& opts, const std::string& log_dir) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  const double started = now_seconds();
  double stopped_at = 0;
  while (open_fds > 0) {
    const int ready = ::poll(fds, 2, 1000);
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
    if (stopped_at > 0) {
      if (now_seconds() - stopped_at > 10) ::kill(mpirun, SIGKILL);  // it did not stop
      continue;
    }
    if (opts.silent_timeout_s <= 0) continue;
    const auto beats = read_heartbeats(log_dir, opts.ranks, started);
    double freshest = 1e300;
    for (const auto& h : beats) freshest = std::min(freshest, h.age_s);
    if (freshest > opts.silent_timeout_s) {
      stop_silent_job(mpirun, beats, opts.silent_timeout_s);
      stopped_at = now_seconds();
    }
  }
  return stopped_at > 0;
}

int report_failure(OutputRouter& router, int code, const std::string& log_dir) {
  std::vector<int> failed = router.failed_ranks();
  if (failed.empty() && router.blamed_by_mpirun() >= 0) failed.push_back(router.blamed_by_mpirun());
  const int sig = router.signal_by_mpirun();
  if (failed.empty()) {
    std::cerr << "launch: mpirun exited with code " << code
              << (code > 128 ? " (" + signal_name(code - 128) + "?)" : "")
              << " and no rank reported an error\n";
    print_tail("last lines of " + log_dir + "/mpirun.log:", router.mpirun_tail());
  }
  for (int r : failed) {
    if (sig > 0 && r == router.blamed_by_mpirun()) {
      std::cerr << "launch: rank " << r << " was killed by " << signal_name(sig) << " (signal "
                << sig << ")\n";
    } else {
      std::cerr << "launch: rank " << r << " failed (mpirun exit code " << code << ")\n";
    }
    if (router.tail(r).empty()) {
      std::cerr << "rank " << r << " wrote nothing to " << router.log_path(r) << "\n";
    } else {
      print_tail("last lines of " + router.log_path(r) + ":", router.tail(r));
    }
  }
  return code != 0 ? code : 1;
}

}  // namespace

int launch(const LaunchOptions& opts) {
  const LaunchPlan plan = plan_launch(opts);
  const std::string log_dir = plan.run_dir + "/logs";
  fs::create_directories(log_dir);
  for (const auto& e : fs::directory_iterator(log_dir)) {  // a previous launch's
    if (e.path().extension() == ".error" || e.path().extension() == ".heartbeat")
      fs::remove(e.path());
  }
  // Logs are appended (a resumed run keeps its history): mark where this launch starts.
  const std::time_t now = std::time(nullptr);
  char stamp[64];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::string cmd;
  for (const auto& a : plan.argv) cmd += (cmd.empty() ? "" : " ") + a;
  OutputRouter router(log_dir, std::string("=== launch ") + stamp + ": " + cmd);
  router.open_rank_logs(opts.ranks);
  std::cerr << "launch: " << opts.ranks << " ranks x " << plan.threads_per_rank << " threads"
            << (plan.oversubscribed ? " (oversubscribed)" : "") << ", logs in " << log_dir << "\n";

  int out_pipe[2], err_pipe[2];
  MOETRON_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
                "launch: pipe: ", std::strerror(errno));
  const pid_t pid = start_mpirun(plan, out_pipe[1], err_pipe[1]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  const bool stopped = pump_output(router, out_pipe[0], err_pipe[0], pid, opts, log_dir);
  router.flush();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (stopped) return 1;  // the silent ranks are named above
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  router.add_error_files();
  if (code == 0 && router.failed_ranks().empty()) return 0;
  return report_failure(router, code, log_dir);
}

}  // namespace moetron::train
