// Helpers for tests that run real programs beside the code under test
// (Prometheus, Chromium, the moetron binary): a child process that is always
// reaped, a free TCP port, and polling with a deadline instead of sleeps.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace moetron::test {

// A child process started with posix_spawn (argv[0] is a path; PATH is not
// searched), its stdout and stderr appended to `log_path` (stderr to
// `err_path` instead when one is given). Destroying it
// terminates it (SIGTERM, then SIGKILL after a grace period) and reaps it.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::string& log_path,
             const std::string& err_path = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // True while the process has not exited.
  bool running();
  // Waits up to `seconds` for it to exit: its exit code (128 + signal when
  // killed by one), or -1 when it is still running.
  int wait(double seconds);
  // SIGTERM, then SIGKILL when it has not exited after `grace_seconds`; its
  // exit code.
  int terminate(double grace_seconds = 5);
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  bool reap(bool block);

  pid_t pid_ = -1;
  std::string log_path_;
  bool reaped_ = false;
  int code_ = -1;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
// closed): for programs that take a port on their command line.
int free_tcp_port();

// Calls `ready` every `interval_s` until it returns true (true) or
// `timeout_s` has passed (false).
bool poll_until(const std::function<bool()>& ready, double timeout_s, double interval_s = 0.05);

// The whole file ("" when it cannot be read).
std::string read_text_file(const std::string& path);

// A fresh empty directory under the system's temporary directory, named
// after `tag` and this process.
std::string fresh_temp_dir(const std::string& tag);

}  // namespace moetron::test
