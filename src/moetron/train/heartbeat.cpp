#include "moetron/train/heartbeat.h"

#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "moetron/comm/wait_hook.h"
#include "moetron/core/error.h"
#include "moetron/train/launcher.h"

namespace moetron::train {

namespace {

std::string heartbeat_path(const std::string& log_dir, int rank) {
  return log_dir + "/rank-" + std::to_string(rank) + ".heartbeat";
}

char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return '?';
  const size_t paren = stat.rfind(')');  // "pid (comm) S ..."
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}

double wall_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

const char* phase_name(HeartbeatPhase p) {
  switch (p) {
    case HeartbeatPhase::start:
      return "start";
    case HeartbeatPhase::end:
      return "end";
    case HeartbeatPhase::wait:
      return "wait";
  }
  return "start";
}

// This process's heartbeat: what the wait hook repeats, and when it last
// wrote. Atomics: the hook runs on whichever thread waits.
std::atomic<int> g_rank{-1};
std::atomic<int64_t> g_step{0};
std::atomic<int64_t> g_first{0};
std::atomic<pid_t> g_first_of{0};  // the process g_first belongs to (a fork starts afresh)
std::atomic<double> g_last_write{-1e300};

void beat_while_waiting() noexcept {
  if (now_seconds() - g_last_write.load(std::memory_order_relaxed) < kWaitBeatInterval) return;
  const int rank = g_rank.load(std::memory_order_relaxed);
  if (rank >= 0) write_heartbeat(rank, g_step.load(), HeartbeatPhase::wait);
}

}  // namespace

double now_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void write_heartbeat(int rank, int64_t step, HeartbeatPhase phase) noexcept {
  const char* dir = std::getenv(kLaunchLogDirEnv);
  if (dir == nullptr || *dir == 0) return;
  g_rank.store(rank);
  g_step.store(step);
  if (g_first_of.load() != ::getpid()) {
    g_first.store(0);
    g_first_of.store(::getpid());
  }
  if (phase == HeartbeatPhase::start && step > 0 && g_first.load() == 0) g_first.store(step);
  g_last_write.store(now_seconds(), std::memory_order_relaxed);
  try {
    const std::string path = heartbeat_path(dir, rank), tmp = path + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%lld %d %s %lld\n", static_cast<long long>(step),
                   static_cast<int>(::getpid()), phase_name(phase),
                   static_cast<long long>(g_first.load()));
      if (std::fclose(f) == 0) std::rename(tmp.c_str(), path.c_str());
    }
  } catch (...) {  // std::string's allocation
  }
}

void start_heartbeats(int rank) noexcept {
  write_heartbeat(rank, 0);
  const char* dir = std::getenv(kLaunchLogDirEnv);
  if (dir != nullptr && *dir != 0) comm::set_wait_hook(&beat_while_waiting);
}

std::vector<Heartbeat> read_heartbeats(const std::string& log_dir, int ranks, double started_s) {
  std::vector<Heartbeat> out;
  const double wall_now = wall_seconds(), mono_now = now_seconds();
  for (int r = 0; r < ranks; ++r) {
    Heartbeat h;
    h.rank = r;
    h.age_s = mono_now - started_s;
    struct stat st {};
    long long step = -1, first = 0;
    int pid = 0;
    char phase[16] = "start";
    FILE* f = std::fopen(heartbeat_path(log_dir, r).c_str(), "r");
    if (f && ::fstat(::fileno(f), &st) == 0 && std::fscanf(f, "%lld %d", &step, &pid) == 2) {
      if (std::fscanf(f, " %15s %lld", phase, &first) < 1) std::strcpy(phase, "start");
      h.seen = true;
      h.step = step;
      h.pid = pid;
      h.phase = phase;
      h.first_step = first;
      const double written =
          static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
      h.age_s = std::max(0.0, wall_now - written);
      h.state = process_state(pid);
    }
    if (f) std::fclose(f);
    out.push_back(h);
  }
  return out;
}

std::vector<std::string> describe_silent_ranks(const std::vector<Heartbeat>& beats,
                                               std::vector<int>* blamed) {
  std::vector<const Heartbeat*> pick;
  for (const auto& h : beats) {
    if (h.state == 'T' || h.state == 't') pick.push_back(&h);
  }
  if (pick.empty()) {
    int64_t lowest = INT64_MAX;
    for (const auto& h : beats) lowest = std::min(lowest, h.seen ? h.step : -1);
    for (const auto& h : beats) {
      if ((h.seen ? h.step : -1) == lowest) pick.push_back(&h);
    }
    std::sort(pick.begin(), pick.end(),
              [](const Heartbeat* a, const Heartbeat* b) { return a->age_s > b->age_s; });
  }
  std::vector<std::string> lines;
  for (const Heartbeat* h : pick) {
    if (blamed) blamed->push_back(h->rank);
    std::string l = "rank " + std::to_string(h->rank);
    if (!h->seen) {
      lines.push_back(l + " never reported a training step (" +
                      std::to_string(static_cast<int64_t>(h->age_s)) + " s since launch)");
      continue;
    }
    l += " (pid " + std::to_string(h->pid) + ")";
    if (h->state == 'T' || h->state == 't') l += " is stopped (SIGSTOP or a debugger)";
    if (h->state == 'Z') l += " has exited";
    lines.push_back(l + ": last step " + std::to_string(h->step) + ", " +
                    std::to_string(static_cast<int64_t>(h->age_s)) + " s ago");
  }
  return lines;
}

std::string describe_stale_rank(const Heartbeat& h) {
  const std::string age = std::to_string(static_cast<int64_t>(h.age_s)) + " s";
  const std::string who = "rank " + std::to_string(h.rank);
  if (!h.seen) return who + " sent no heartbeat in the " + age + " since the attempt started";
  std::string last = h.phase == "end"    ? "finished step "
                     : h.phase == "wait" ? "waiting in a collective in step "
                                         : "started step ";
  std::string l = who + " (pid " + std::to_string(h.pid) + ")";
  if (h.state == 'T' || h.state == 't') l += " is stopped (SIGSTOP or a debugger) and";
  return l + " sent no heartbeat for " + age + " (last: " + last + std::to_string(h.step) + ")";
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace moetron::train
