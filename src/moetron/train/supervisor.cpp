// `moetron launch`'s supervisor: runs attempts (train/launcher.h's
// run_attempt), watches their heartbeats, and after a failure, a hang or a
// stop for a resize relaunches the whole job with --resume, as
// train/supervisor_policy.h decides. Everything it sees and does is a line
// of RUN/events.jsonl and of stderr.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "moetron/core/error.h"
#include "moetron/monitor/event_log.h"
#include "moetron/train/heartbeat.h"
#include "moetron/train/launch_output.h"
#include "moetron/train/launcher.h"
#include "moetron/train/supervisor_policy.h"

namespace moetron::train {

namespace fs = std::filesystem;

namespace {

constexpr double kWatchPollS = 1.0;     // heartbeat reads while an attempt runs
constexpr double kRecoveryPollS = 0.1;  // ... while a restarted job has not finished a step

bool has_arg(const std::vector<std::string>& cmd, const std::string& arg) {
  return std::find(cmd.begin(), cmd.end(), arg) != cmd.end();
}

std::string timestamp() {
  const std::time_t now = std::time(nullptr);
  char stamp[64];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return stamp;
}

double epoch_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// What one attempt leaves in RUN/logs that would mislead the next: its
// heartbeats, error files and the resize handshake. `markers` also removes
// the injected-failure markers (at the start of a launch, not between
// attempts: train/fault_injection.h).
void clear_logs(const std::string& log_dir, bool markers) {
  for (const auto& e : fs::directory_iterator(log_dir)) {
    const std::string name = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    if (ext == ".error" || ext == ".heartbeat" || name.ends_with(".heartbeat.tmp") ||
        name == "stop-request" || name == "stopped-for-resize" ||
        (markers && name.starts_with("injected-"))) {
      fs::remove(e.path());
    }
  }
}

int64_t max_step(const std::vector<Heartbeat>& beats) {
  int64_t s = 0;
  for (const Heartbeat& h : beats) s = std::max(s, h.seen ? h.step : 0);
  return s;
}

int64_t last_step_of(const std::vector<Heartbeat>& beats, int rank) {
  for (const Heartbeat& h : beats) {
    if (h.rank == rank && h.seen) return h.step;
  }
  return rank < 0 ? max_step(beats) : 0;
}

// Asked by run_attempt about every 0.1 s whether to stop the job: reads the
// heartbeats (every second; every 0.1 s while a restarted job has not
// finished its first step), names a hung rank or a silent job, writes the
// "recovered" event, and asks for a resize when capacity returned.
class AttemptWatch {
 public:
  AttemptWatch(const LaunchOptions& opts, const SupervisorLimits& limits, std::string log_dir,
               int ranks, int attempt, std::optional<double> failed_at, monitor::EventLog& events)
      : opts_(opts),
        limits_(limits),
        log_dir_(std::move(log_dir)),
        ranks_(ranks),
        attempt_(attempt),
        failed_at_(failed_at),
        events_(events),
        started_(now_seconds()) {}

  bool operator()() {
    const double now = now_seconds();
    if (now - last_read_ < (failed_at_ ? kRecoveryPollS : kWatchPollS)) return false;
    last_read_ = now;
    beats_ = read_heartbeats(log_dir_, ranks_, started_);
    if (failed_at_) check_recovery(now);
    if (check_hung() || check_silent(now)) {
      detected_at_ = now;
      return true;
    }
    check_capacity();
    return false;
  }
  // After the attempt: a job that finished its first step and exited
  // between two reads still gets its "recovered" event.
  void settle() {
    if (!failed_at_) return;
    beats_ = read_heartbeats(log_dir_, ranks_, started_);
    check_recovery(now_seconds());
  }
  AttemptEnd end() const { return end_; }
  double detected_at() const { return detected_at_; }
  const std::vector<RankFailure>& failures() const { return failures_; }
  const std::vector<Heartbeat>& beats() const { return beats_; }
  // A restarted job that never finished a step still owes its recovery.
  std::optional<double> failed_at() const { return failed_at_; }

 private:
  void check_recovery(double now) {
    const auto done = first_completed_step(beats_);
    if (!done) return;
    const double seconds = std::max(0.0, now - done->age_s - *failed_at_);
    std::cerr << "launch: recovered: step " << done->step << " completed " << seconds
              << " s after the failure was detected (resumed from step " << done->resumed_from
              << ")" << std::endl;
    events_.write(done->step, "recovered",
                  "attempt " + std::to_string(attempt_) + " completed step " +
                      std::to_string(done->step) + " " + std::to_string(seconds) +
                      " s after the failure was detected",
                  {{"attempt", attempt_},
                   {"seconds", seconds},
                   {"resumed_from", done->resumed_from},
                   {"ranks", ranks_}});
    failed_at_.reset();
  }
  bool check_hung() {
    if (opts_.heartbeat_timeout_s <= 0) return false;
    const std::vector<int> hung = hung_ranks(beats_, opts_.heartbeat_timeout_s);
    if (hung.empty()) return false;
    std::cerr << "launch: a rank sent no heartbeat for " << opts_.heartbeat_timeout_s
              << " s (--heartbeat-timeout) while the others did; hung:\n";
    for (int r : hung) {
      const Heartbeat& h = beats_[static_cast<size_t>(r)];
      std::cerr << "  " << describe_stale_rank(h) << "\n";
      failures_.push_back({r, "hung", describe_stale_rank(h), h.seen ? h.step : 0});
    }
    std::cerr << "launch: stopping the job" << std::endl;
    end_ = AttemptEnd::hung;
    return true;
  }
  bool check_silent(double now) {
    if (opts_.silent_timeout_s <= 0) return false;
    const std::vector<Heartbeat> ages = clock_.step_ages(beats_, now);
    if (!job_is_silent(ages, opts_.silent_timeout_s)) return false;
    std::cerr << "launch: no rank has started a training step for " << opts_.silent_timeout_s
              << " s (--silent-timeout); silent:\n";
    std::vector<int> blamed;
    const auto lines = describe_silent_ranks(ages, &blamed);
    for (size_t i = 0; i < lines.size(); ++i) {
      std::cerr << "  " << lines[i] << "\n";
      failures_.push_back({blamed[i], "silent", lines[i], last_step_of(beats_, blamed[i])});
    }
    std::cerr << "launch: stopping the job" << std::endl;
    end_ = AttemptEnd::silent;
    return true;
  }
  void check_capacity() {
    if (limits_.min_ranks <= 0 || grow_asked_) return;
    try {
      const ElasticFiles files = read_elastic_files(log_dir_);
      if (!wants_to_grow(limits_, files, ranks_)) return;
      std::ofstream(log_dir_ + "/stop-request")
          << "resize to " << usable_ranks(limits_, files) << "\n";
      std::cerr << "launch: capacity for " << usable_ranks(limits_, files) << " ranks (running "
                << ranks_ << "): asked the job to stop for a resize" << std::endl;
      grow_asked_ = true;
    } catch (const Error& e) {
      if (!capacity_warned_) std::cerr << "warning: " << e.what() << std::endl;
      capacity_warned_ = true;
    }
  }

  const LaunchOptions& opts_;
  const SupervisorLimits& limits_;
  std::string log_dir_;
  int ranks_, attempt_;
  std::optional<double> failed_at_;
  monitor::EventLog& events_;
  double started_, last_read_ = -1e300, detected_at_ = 0;
  std::vector<Heartbeat> beats_;
  StepClock clock_;
  AttemptEnd end_ = AttemptEnd::finished;
  std::vector<RankFailure> failures_;
  bool grow_asked_ = false, capacity_warned_ = false;
};

// Prints which rank failed and its last log lines, as launch always has.
void report_failure(OutputRouter& router, int code, const std::string& log_dir,
                    const std::vector<int>& failed) {
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
}

// The failures of an attempt that ended by itself, from mpirun's messages
// and the ranks' error lines and files; reported on stderr.
std::vector<RankFailure> collect_failures(OutputRouter& router, int code,
                                          const std::string& log_dir,
                                          const std::vector<Heartbeat>& beats) {
  std::vector<int> failed = router.failed_ranks();
  const int blamed = router.blamed_by_mpirun();
  if (failed.empty() && blamed >= 0) failed.push_back(blamed);
  report_failure(router, code, log_dir, failed);
  std::vector<RankFailure> out;
  for (int r : failed) {
    RankFailure f{r, "", router.error_line(r), last_step_of(beats, r)};
    if (!f.detail.empty()) {
      f.cause = "error";
    } else if (r == blamed && router.signal_by_mpirun() > 0) {
      f.cause = signal_name(router.signal_by_mpirun());
    } else if (r == blamed && router.exit_code_by_mpirun() >= 0) {
      f.cause = "exit code " + std::to_string(router.exit_code_by_mpirun());
    } else {
      f.cause = "exit code " + std::to_string(code);
    }
    out.push_back(f);
  }
  if (out.empty()) out.push_back({-1, "mpirun exit code " + std::to_string(code), "", 0});
  for (RankFailure& f : out) {
    if (f.rank < 0) f.last_step = max_step(beats);
  }
  return out;
}

// One attempt as the supervisor saw it.
struct Attempt {
  AttemptOutcome outcome;
  double detected_at = 0;  // now_seconds() when its end was known
  int64_t last_step = 0;   // the furthest step any rank started
};

class Supervisor {
 public:
  Supervisor(const LaunchOptions& opts, const std::string& run_dir)
      : opts_(opts),
        limits_{opts.ranks, opts.max_restarts, opts.min_ranks},
        log_dir_(run_dir + "/logs"),
        stamp_(timestamp()),
        events_(run_dir + "/events.jsonl") {}

  int run() {
    int ranks = opts_.ranks, restarts = 0;
    std::optional<double> failed_at;
    for (int attempt = 1;; ++attempt) {
      const Attempt a = run_one(attempt, ranks, restarts, failed_at);
      const AttemptOutcome& out = a.outcome;
      record_failures(attempt, a);
      const ElasticFiles files =
          limits_.min_ranks > 0 ? read_elastic_files(log_dir_) : ElasticFiles{};
      const Decision d = decide_next(out, ranks, restarts, limits_, files);
      if (d.next == NextStep::done) return 0;
      if (d.next == NextStep::give_up) return give_up(d, a, attempt);
      failed_at = a.detected_at;
      if (d.next == NextStep::resize) {
        std::cerr << "launch: resizing from " << ranks << " to " << d.ranks << " ranks after step "
                  << out.stopped_step << " (attempt " << attempt + 1 << ")" << std::endl;
        events_.write(
            out.stopped_step, "resize",
            "resizing from " + std::to_string(ranks) + " to " + std::to_string(d.ranks) + " ranks",
            {{"from", ranks}, {"to", d.ranks}, {"attempt", attempt + 1}});
      } else {
        ++restarts;
        std::string after;
        for (const RankFailure& f : out.failures)
          after += (after.empty() ? "" : "; ") + describe_failure(f);
        const std::string line = "restart " + std::to_string(restarts) + " of " +
                                 std::to_string(limits_.max_restarts) + " (attempt " +
                                 std::to_string(attempt + 1) + "): relaunching " +
                                 std::to_string(d.ranks) + " ranks with --resume after " + after;
        std::cerr << "launch: " << line << std::endl;
        events_.write(a.last_step, "restart", line,
                      {{"attempt", attempt + 1},
                       {"restart", restarts},
                       {"max_restarts", limits_.max_restarts},
                       {"ranks", d.ranks}});
      }
      ranks = d.ranks;
    }
  }

 private:
  Attempt run_one(int attempt, int ranks, int restarts, std::optional<double>& failed_at) {
    LaunchOptions o = opts_;
    o.ranks = ranks;
    o.restarts = restarts;
    // The ranks may run elsewhere: they get the detection as wall-clock time.
    if (restarts > 0 && failed_at)
      o.failure_detected_at = epoch_seconds() - (now_seconds() - *failed_at);
    if (attempt > 1 && o.command[0] == "train" && !has_arg(o.command, "--resume"))
      o.command.push_back("--resume");
    const LaunchPlan plan = plan_launch(o);
    clear_logs(log_dir_, false);
    const std::string which =
        attempt == 1 ? "" : ", attempt " + std::to_string(attempt) + " at " + timestamp();
    OutputRouter router(log_dir_, "=== launch " + stamp_ + which + ": " + join(plan.argv));
    router.open_rank_logs(ranks);
    std::cerr << "launch: " << (attempt == 1 ? "" : "attempt " + std::to_string(attempt) + ": ")
              << ranks << " ranks x " << plan.threads_per_rank << " threads"
              << (plan.oversubscribed ? " (oversubscribed)" : "") << ", logs in " << log_dir_
              << "\n";
    AttemptWatch watch(opts_, limits_, log_dir_, ranks, attempt, failed_at, events_);
    const AttemptRun run = run_attempt(plan, ranks, router, [&watch] { return watch(); });
    watch.settle();
    failed_at = watch.failed_at();
    Attempt a;
    a.detected_at = run.stopped ? watch.detected_at() : now_seconds();
    const std::vector<Heartbeat> beats = read_heartbeats(log_dir_, ranks, 0);
    a.last_step = max_step(beats);
    AttemptOutcome& out = a.outcome;
    if (run.stopped) {
      out.end = watch.end();
      out.failures = watch.failures();
      out.code = 1;
    } else {
      router.add_error_files();
      if (run.code == 0 && router.failed_ranks().empty()) {
        std::ifstream stopped(log_dir_ + "/stopped-for-resize");
        if (stopped >> out.stopped_step) out.end = AttemptEnd::stopped_for_resize;
        return a;
      }
      out.end = AttemptEnd::failed;
      out.code = run.code != 0 ? run.code : 1;
      out.failures = collect_failures(router, run.code, log_dir_, beats);
    }
    for (const RankFailure& f : out.failures)
      router.note("=== attempt " + std::to_string(attempt) + " failed: " + describe_failure(f));
    return a;
  }

  void record_failures(int attempt, const Attempt& a) {
    // The event is written once the attempt has stopped; detected_at says
    // when the supervisor knew (Unix time, as the event's own "time").
    const double detected = monitor::unix_time() - (now_seconds() - a.detected_at);
    for (const RankFailure& f : a.outcome.failures) {
      const std::string what = describe_failure(f);
      history_.push_back("attempt " + std::to_string(attempt) + ": " + what);
      events_.write(f.last_step, "failure", "attempt " + std::to_string(attempt) + ": " + what,
                    {{"attempt", attempt},
                     {"rank", f.rank},
                     {"cause", f.cause},
                     {"detail", f.detail},
                     {"last_step", f.last_step},
                     {"detected_at", detected}});
    }
  }

  int give_up(const Decision& d, const Attempt& a, int attempt) {
    if (d.why.empty()) return a.outcome.code;  // --max-restarts 0: reported as it always was
    std::cerr << "launch: giving up after attempt " << attempt << ": " << d.why << "; failures:\n";
    for (const std::string& h : history_) std::cerr << "  " << h << "\n";
    std::cerr << std::flush;
    events_.write(a.last_step, "give_up",
                  "giving up after attempt " + std::to_string(attempt) + ": " + d.why,
                  {{"attempt", attempt}, {"failures", history_}});
    return a.outcome.code;
  }

  const LaunchOptions& opts_;
  const SupervisorLimits limits_;
  const std::string log_dir_, stamp_;
  monitor::EventLog events_;
  std::vector<std::string> history_;  // every failure so far, for giving up
};

}  // namespace

int launch(const LaunchOptions& opts) {
  MOETRON_CHECK(opts.max_restarts >= 0, "launch: --max-restarts must be >= 0, got ",
                opts.max_restarts);
  MOETRON_CHECK(opts.heartbeat_timeout_s >= 0,
                "launch: --heartbeat-timeout must be >= 0 (0: never), got ",
                opts.heartbeat_timeout_s);
  MOETRON_CHECK(opts.min_ranks >= 0 && opts.min_ranks <= opts.ranks,
                "launch: --min-ranks must be between 0 (a fixed size) and -n (", opts.ranks,
                "), got ", opts.min_ranks);
  const LaunchPlan plan = plan_launch(opts);  // checks the rest before anything is touched
  fs::create_directories(plan.run_dir + "/logs");
  clear_logs(plan.run_dir + "/logs", true);
  Supervisor supervisor(opts, plan.run_dir);
  return supervisor.run();
}

}  // namespace moetron::train
