#include "moetron/train/heartbeat.h"

#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

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

}  // namespace

double now_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void write_heartbeat(int rank, int64_t step) noexcept {
  const char* dir = std::getenv(kLaunchLogDirEnv);
  if (dir == nullptr || *dir == 0) return;
  const std::string path = heartbeat_path(dir, rank);
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%lld %d\n", static_cast<long long>(step), static_cast<int>(::getpid()));
    std::fclose(f);
  }
}

std::vector<Heartbeat> read_heartbeats(const std::string& log_dir, int ranks, double started_s) {
  std::vector<Heartbeat> out;
  const double wall_now = wall_seconds(), mono_now = now_seconds();
  for (int r = 0; r < ranks; ++r) {
    Heartbeat h;
    h.rank = r;
    h.age_s = mono_now - started_s;
    const std::string path = heartbeat_path(log_dir, r);
    struct stat st {};
    long long step = -1;
    int pid = 0;
    FILE* f = std::fopen(path.c_str(), "r");
    if (f && ::stat(path.c_str(), &st) == 0 && std::fscanf(f, "%lld %d", &step, &pid) == 2) {
      h.seen = true;
      h.step = step;
      h.pid = pid;
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

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace moetron::train
