// A bounded, thread-safe list of published JSON lines (metrics.jsonl steps,
// events.jsonl events), each stored once as text under an increasing key, so
// the HTTP server answers "everything after key K" with one copy under the
// lock and no re-serialisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

namespace moetron::monitor {

// What to drop when the history is over its bounds.
enum class HistoryOverflow {
  // Every other line of the whole history (the newest kept): the history
  // always spans the whole run, older parts at a coarser resolution.
  thin,
  // The oldest lines.
  drop_oldest,
};

struct HistoryPage {
  std::string json;      // a JSON array of the lines, in publication order
  int64_t last_key = 0;  // the key of the last line in `json`, or the `since` asked for
  size_t count = 0;      // lines in `json`
};

class LineHistory {
 public:
  // max_lines >= 2; max_bytes bounds the stored text (lines of any size are
  // kept while they are the only ones).
  LineHistory(size_t max_lines, size_t max_bytes, HistoryOverflow overflow);

  // Appends one line (a JSON value as text) under `key`. Keys are expected to
  // increase; a key not above the last one is accepted (a resumed run may
  // repeat steps) and only changes what `after` returns for it.
  void append(int64_t key, std::string json_text);

  // The lines whose key is greater than `since`, at most `max_count`, oldest
  // first.
  HistoryPage after(int64_t since, size_t max_count) const;

  size_t size() const;
  size_t bytes() const;
  // The key of the newest line, `none` when there is none.
  int64_t last_key(int64_t none) const;

 private:
  struct Line {
    int64_t key;
    std::string text;
  };
  void shrink_locked();

  size_t max_lines_;
  size_t max_bytes_;
  HistoryOverflow overflow_;
  mutable std::mutex mu_;
  std::deque<Line> lines_;
  size_t bytes_ = 0;
};

}  // namespace moetron::monitor
