#include "moetron/monitor/event_log.h"

#include <chrono>
#include <iostream>

namespace moetron::monitor {

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventLog::EventLog(std::string path) : path_(std::move(path)), out_(path_, std::ios::app) {
  if (!out_.good()) {
    std::cerr << "warning: cannot open '" << path_ << "' for writing: events are not recorded\n";
  }
}

nlohmann::json EventLog::write(int64_t step, const std::string& kind, const std::string& message,
                               nlohmann::json extra) {
  nlohmann::json line = std::move(extra);
  line["time"] = unix_time();
  line["step"] = step;
  line["kind"] = kind;
  line["message"] = message;
  out_ << line.dump() << "\n" << std::flush;
  if (!out_.good()) {
    if (failed_++ == 0) {
      std::cerr << "warning: writing '" << path_ << "' failed (disk full?): events are lost\n";
    }
    out_.clear();
  }
  if (on_event) on_event(line);
  return line;
}

}  // namespace moetron::monitor
