#include "moetron/train/fault_injection.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "moetron/core/error.h"
#include "moetron/train/launcher.h"

namespace moetron::train {

namespace {

constexpr const char* kGrammar =
    "rank=R,step=S[,kind=error|kill|hang|exit|slow|disk-full|stop|segv]"
    "[,at=step|snapshot|persist][,seconds=X] with integers R, S >= 0, ';' between failures";

// The text of failure `index` of `count` and the whole variable, for errors.
struct Where {
  const std::string& spec;
  const std::string& item;
  int index;
  size_t count;
};

[[noreturn]] void malformed(const Where& w, const std::string& why) {
  const std::string in =
      w.count > 1 ? "in failure " + std::to_string(w.index + 1) + " ('" + w.item + "'), " : "";
  MOETRON_FAIL(kInjectFailureEnv, "='", w.spec, "' is malformed: ", in, why, " (expected ",
               kGrammar, ")");
}

int64_t parse_int(const Where& w, const std::string& key, const std::string& text) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) {
    malformed(w, key + " '" + text + "' is not an integer >= 0");
  }
  return v;
}

double parse_seconds(const Where& w, const std::string& text) {
  char* end = nullptr;
  const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != 0 || !(v > 0) || v > 1e6)
    malformed(w, "seconds '" + text + "' is not a number > 0");
  return v;
}

std::optional<FailureKind> kind_named(const std::string& s) {
  for (FailureKind k :
       {FailureKind::error, FailureKind::kill, FailureKind::hang, FailureKind::exit,
        FailureKind::slow, FailureKind::disk_full, FailureKind::stop, FailureKind::segv}) {
    if (failure_kind_name(k) == s) return k;
  }
  return std::nullopt;
}

std::optional<FailurePoint> point_named(const std::string& s) {
  for (FailurePoint p : {FailurePoint::step, FailurePoint::snapshot, FailurePoint::persist}) {
    if (failure_point_name(p) == s) return p;
  }
  return std::nullopt;
}

// One failure's "key=value,..." text.
InjectedFailure parse_one(const Where& w) {
  std::optional<int64_t> rank, step;
  std::optional<FailureKind> kind;
  std::optional<FailurePoint> at;
  std::optional<double> seconds;
  bool by_signal = false;
  const std::string& text = w.item;
  for (size_t begin = 0; begin <= text.size();) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) malformed(w, "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto once = [&](bool given) {
      if (given) malformed(w, "'" + key + "' given twice");
    };
    if (key == "rank" || key == "step") {
      once((key == "rank" ? rank : step).has_value());
      (key == "rank" ? rank : step) = parse_int(w, key, value);
    } else if (key == "kind" || key == "signal") {
      if (kind && by_signal == (key == "signal")) malformed(w, "'" + key + "' given twice");
      if (kind) malformed(w, "give kind or signal, not both");
      by_signal = key == "signal";
      if (by_signal && value != "KILL" && value != "STOP" && value != "SEGV")
        malformed(w, "signal '" + value + "' is not KILL, STOP or SEGV");
      std::string lower = value;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      kind = kind_named(by_signal ? lower : value);
      if (!kind) {
        malformed(w, "kind '" + value +
                         "' is not error, kill, hang, exit, slow, disk-full, stop or segv");
      }
    } else if (key == "at") {
      once(at.has_value());
      at = point_named(value);
      if (!at) malformed(w, "at '" + value + "' is not step, snapshot or persist");
    } else if (key == "seconds") {
      once(seconds.has_value());
      seconds = parse_seconds(w, value);
    } else {
      malformed(w, "unknown key '" + key + "'");
    }
  }
  if (!rank) malformed(w, "'rank' is missing");
  if (!step) malformed(w, "'step' is missing");
  if (*rank > INT32_MAX) malformed(w, "rank " + std::to_string(*rank) + " is out of range");
  InjectedFailure f{w.index,
                    static_cast<int>(*rank),
                    *step,
                    kind.value_or(FailureKind::error),
                    at.value_or(FailurePoint::step),
                    seconds.value_or(0)};
  if (f.kind == FailureKind::slow && f.at != FailurePoint::step)
    malformed(w, "kind slow takes no 'at'");
  if ((f.kind == FailureKind::slow) != seconds.has_value())
    malformed(w, seconds ? "'seconds' goes with kind=slow only" : "kind=slow needs seconds=X");
  if (f.step == 0 && f.at != FailurePoint::step)
    malformed(w, "step 0 (start-up) has no " + failure_point_name(f.at));
  return f;
}

// Failures that have fired in this process, by index and text (slow keeps
// firing; disk-full fires once).
std::mutex g_fired_mutex;
std::set<std::string> g_fired;

std::string fired_key(const InjectedFailure& f, const std::string& spec) {
  return std::to_string(f.index) + ":" + spec;
}

// Whether `f` fires now, recording it: under launch, in RUN/logs/injected-<i>
// (a failure whose marker exists fired in an earlier attempt).
bool claim(const InjectedFailure& f, const std::string& spec) {
  const std::string key = fired_key(f, spec);
  std::lock_guard<std::mutex> lock(g_fired_mutex);
  const bool fired_here = g_fired.count(key) > 0;
  if (fired_here) return f.kind == FailureKind::slow;
  const char* dir = std::getenv(kLaunchLogDirEnv);
  if (dir != nullptr && *dir != 0) {
    const std::string marker = std::string(dir) + "/injected-" + std::to_string(f.index);
    const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) return false;
    if (fd < 0) {
      std::cerr << "warning: cannot create '" << marker << "' (" << std::strerror(errno)
                << "): injected failure " << f.index << " may fire again after a restart\n";
    } else {
      const std::string line = "rank " + std::to_string(f.rank) + " step " +
                               std::to_string(f.step) + " " + failure_kind_name(f.kind) + "\n";
      (void)!::write(fd, line.data(), line.size());
      ::close(fd);
    }
  } else if (f.kind != FailureKind::disk_full) {
    return true;  // without launch: no memory, as before markers existed
  }
  g_fired.insert(key);
  return true;
}

void fire(const InjectedFailure& f, int64_t step) {
  std::fflush(stdout);
  std::fflush(stderr);
  switch (f.kind) {
    case FailureKind::kill:
      ::raise(SIGKILL);
      return;
    case FailureKind::segv:
      ::raise(SIGSEGV);
      return;
    case FailureKind::stop:
      ::raise(SIGSTOP);
      return;  // continued: carry on
    case FailureKind::exit:
      ::_exit(1);
    case FailureKind::hang:
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    case FailureKind::slow:
      std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
      return;
    case FailureKind::error:
    case FailureKind::disk_full:
      break;
  }
  MOETRON_FAIL(kInjectFailureEnv, ": injected failure on rank ", f.rank, " at step ", step,
               f.at == FailurePoint::step ? "" : " (" + failure_point_name(f.at) + ")");
}

}  // namespace

std::string failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::error:
      return "error";
    case FailureKind::kill:
      return "kill";
    case FailureKind::hang:
      return "hang";
    case FailureKind::exit:
      return "exit";
    case FailureKind::slow:
      return "slow";
    case FailureKind::disk_full:
      return "disk-full";
    case FailureKind::stop:
      return "stop";
    case FailureKind::segv:
      return "segv";
  }
  return "error";
}

std::string failure_point_name(FailurePoint at) {
  switch (at) {
    case FailurePoint::step:
      return "step";
    case FailurePoint::snapshot:
      return "snapshot";
    case FailurePoint::persist:
      return "persist";
  }
  return "step";
}

std::vector<InjectedFailure> parse_injected_failures(const std::string& spec) {
  std::vector<std::string> items;
  for (size_t begin = 0; !spec.empty() && begin <= spec.size();) {
    size_t end = spec.find(';', begin);
    if (end == std::string::npos) end = spec.size();
    items.push_back(spec.substr(begin, end - begin));
    begin = end + 1;
  }
  std::vector<InjectedFailure> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const Where w{spec, items[i], static_cast<int>(i), items.size()};
    if (items[i].empty()) malformed(w, "failure " + std::to_string(i + 1) + " is empty");
    out.push_back(parse_one(w));
  }
  return out;
}

void maybe_inject_failure(int rank, int64_t step, FailurePoint at) {
  const char* env = std::getenv(kInjectFailureEnv);
  if (env == nullptr) return;
  const std::string spec = env;
  for (const InjectedFailure& f : parse_injected_failures(spec)) {
    if (f.rank != rank || f.kind == FailureKind::disk_full || f.at != at) continue;
    const bool due = f.kind == FailureKind::slow ? step >= f.step : step == f.step;
    if (due && claim(f, spec)) fire(f, step);
  }
}

void maybe_fail_write(int rank, int64_t step, const std::string& path, FailurePoint what) {
  const char* env = std::getenv(kInjectFailureEnv);
  if (env == nullptr) return;
  const std::string spec = env;
  for (const InjectedFailure& f : parse_injected_failures(spec)) {
    if (f.rank != rank || f.kind != FailureKind::disk_full || step < f.step) continue;
    if (f.at != FailurePoint::step && f.at != what) continue;  // another kind of write
    if (!claim(f, spec)) continue;
    MOETRON_FAIL("cannot write '", path, "': No space left on device (injected by ",
                 kInjectFailureEnv, " on rank ", rank, " at step ", step, ")");
  }
}

}  // namespace moetron::train
