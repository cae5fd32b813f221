#include "moetron/monitor/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>

namespace moetron::monitor {

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventLog::EventLog(std::string path)
    : path_(std::move(path)),
      fd_(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
  if (fd_ < 0) {
    std::cerr << "warning: cannot open '" << path_ << "' for writing (" << std::strerror(errno)
              << "): events are not recorded\n";
  }
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

nlohmann::json EventLog::write(int64_t step, const std::string& kind, const std::string& message,
                               nlohmann::json extra) {
  nlohmann::json line = std::move(extra);
  line["time"] = unix_time();
  line["step"] = step;
  line["kind"] = kind;
  line["message"] = message;
  // One write(2) per line: O_APPEND places it whole at the end even while
  // another process appends (a short write only comes from a full disk).
  const std::string text = line.dump() + "\n";
  ssize_t n = -1;
  if (fd_ >= 0) {
    do {
      n = ::write(fd_, text.data(), text.size());
    } while (n < 0 && errno == EINTR);
  }
  if (n != static_cast<ssize_t>(text.size())) {
    if (failed_++ == 0) {
      std::cerr << "warning: writing '" << path_ << "' failed (disk full?): events are lost\n";
    }
  }
  if (on_event) on_event(line);
  return line;
}

}  // namespace moetron::monitor
