#include "moetron/monitor/line_history.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::monitor {

LineHistory::LineHistory(size_t max_lines, size_t max_bytes, HistoryOverflow overflow)
    : max_lines_(max_lines), max_bytes_(max_bytes), overflow_(overflow) {
  MOETRON_CHECK(max_lines >= 2, "a line history keeps at least 2 lines, got ", max_lines);
}

void LineHistory::append(int64_t key, std::string json_text) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_ += json_text.size();
  lines_.push_back(Line{key, std::move(json_text)});
  shrink_locked();
}

void LineHistory::shrink_locked() {
  while (lines_.size() > 1 && (lines_.size() > max_lines_ || bytes_ > max_bytes_)) {
    if (overflow_ == HistoryOverflow::drop_oldest) {
      bytes_ -= lines_.front().text.size();
      lines_.pop_front();
      continue;
    }
    // Keep the lines at odd distance from the newest and the newest itself:
    // about half, spread evenly over the run.
    std::deque<Line> kept;
    const size_t n = lines_.size();
    bytes_ = 0;
    for (size_t i = 0; i < n; ++i) {
      if ((n - 1 - i) % 2 == 0) {
        bytes_ += lines_[i].text.size();
        kept.push_back(std::move(lines_[i]));
      }
    }
    lines_ = std::move(kept);
  }
}

HistoryPage LineHistory::after(int64_t since, size_t max_count) const {
  std::lock_guard<std::mutex> lock(mu_);
  // The newest lines whose keys are all above `since` (keys normally
  // increase, so this is the part of the history the caller has not seen).
  size_t first = lines_.size();
  while (first > 0 && lines_[first - 1].key > since) --first;
  const size_t last = std::min(lines_.size(), first + max_count);

  HistoryPage page;
  page.last_key = since;
  size_t total = 2;
  for (size_t i = first; i < last; ++i) total += lines_[i].text.size() + 1;
  page.json.reserve(total);
  page.json += '[';
  for (size_t i = first; i < last; ++i) {
    if (i > first) page.json += ',';
    page.json += lines_[i].text;
    page.last_key = lines_[i].key;
  }
  page.json += ']';
  page.count = last - first;
  return page;
}

size_t LineHistory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_.size();
}

size_t LineHistory::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int64_t LineHistory::last_key(int64_t none) const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_.empty() ? none : lines_.back().key;
}

}  // namespace moetron::monitor
