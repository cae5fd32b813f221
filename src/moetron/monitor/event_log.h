// RUN_DIR/events.jsonl: what happened during a run, one JSON object per
// line ({"time", "step", "kind", "message", ...}), appended at once so a
// crash keeps everything before it. Several processes append to one file
// (the trainer's rank 0 and `moetron launch`'s supervisor): each line is one
// write(2) on an O_APPEND descriptor, so lines never interleave. A write
// that fails is reported once on stderr and counted, never silently dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace moetron::monitor {

class EventLog {
 public:
  explicit EventLog(std::string path);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  // extra's fields are added to the line (time, step, kind and message win).
  nlohmann::json write(int64_t step, const std::string& kind, const std::string& message,
                       nlohmann::json extra = nlohmann::json::object());
  int64_t failed_writes() const { return failed_; }
  const std::string& path() const { return path_; }
  // Called with every event written (e.g. the dashboard's server).
  std::function<void(const nlohmann::json&)> on_event;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t failed_ = 0;
};

// Seconds since the Unix epoch, with sub-second precision.
double unix_time();

}  // namespace moetron::monitor
