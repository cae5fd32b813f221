#include "moetron/train/supervisor_policy.h"

#include <algorithm>
#include <charconv>
#include <fstream>

#include "moetron/core/error.h"

namespace moetron::train {

namespace {

// The integers of `path`, one per line (blank lines and # comments skipped).
std::vector<int> read_numbers(const std::string& path) {
  std::vector<int> out;
  std::ifstream f(path);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const std::string text = line.substr(b, e - b + 1);
    int v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    MOETRON_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 0, "launch: '",
                  path, "' line ", n, ": '", text, "' is not an integer >= 0");
    out.push_back(v);
  }
  return out;
}

}  // namespace

std::string describe_failure(const RankFailure& f) {
  std::string s = f.rank >= 0 ? "rank " + std::to_string(f.rank) + ": " : "";
  s += f.cause + " at step " + std::to_string(f.last_step);
  if (!f.detail.empty()) s += " (" + f.detail + ")";
  return s;
}

ElasticFiles read_elastic_files(const std::string& log_dir) {
  ElasticFiles files;
  for (int r : read_numbers(log_dir + "/unavailable")) files.unavailable.insert(r);
  const std::vector<int> cap = read_numbers(log_dir + "/capacity");
  MOETRON_CHECK(cap.size() <= 1, "launch: '", log_dir, "/capacity' holds ", cap.size(),
                " numbers; expected one (the ranks available now)");
  if (!cap.empty()) files.capacity = cap[0];
  return files;
}

int usable_ranks(const SupervisorLimits& limits, const ElasticFiles& files) {
  if (limits.min_ranks <= 0) return limits.ranks;
  if (files.capacity) return std::min(limits.ranks, *files.capacity);
  const auto gone = std::count_if(files.unavailable.begin(), files.unavailable.end(),
                                  [&](int r) { return r < limits.ranks; });
  return limits.ranks - static_cast<int>(gone);
}

bool wants_to_grow(const SupervisorLimits& limits, const ElasticFiles& files, int current_ranks) {
  return limits.min_ranks > 0 && files.capacity &&
         std::min(limits.ranks, *files.capacity) > current_ranks;
}

Decision decide_next(const AttemptOutcome& outcome, int current_ranks, int restarts_done,
                     const SupervisorLimits& limits, const ElasticFiles& files) {
  if (outcome.end == AttemptEnd::finished) return {NextStep::done, current_ranks, ""};
  const bool elastic = limits.min_ranks > 0;
  const int usable = elastic ? usable_ranks(limits, files) : current_ranks;
  if (elastic && usable < limits.min_ranks) {
    std::string why = str_cat("only ", usable, " of ", limits.ranks, " ranks are usable (");
    if (files.capacity) {
      why += str_cat("RUN/logs/capacity says ", *files.capacity);
    } else {
      why += "unavailable:";
      for (int r : files.unavailable) why += str_cat(" ", r);
    }
    why += str_cat("), fewer than --min-ranks ", limits.min_ranks);
    return {NextStep::give_up, usable, why};
  }
  if (outcome.end == AttemptEnd::stopped_for_resize) return {NextStep::resize, usable, ""};
  if (restarts_done >= limits.max_restarts) {
    return {NextStep::give_up, current_ranks,
            limits.max_restarts == 0
                ? ""
                : "all " + std::to_string(limits.max_restarts) + " restarts (--max-restarts) made"};
  }
  return {NextStep::restart, usable, ""};
}

std::vector<int> hung_ranks(const std::vector<Heartbeat>& beats, double timeout_s) {
  const bool any_fresh = std::any_of(beats.begin(), beats.end(), [&](const Heartbeat& h) {
    return h.seen && h.age_s <= timeout_s;
  });
  std::vector<int> hung;
  if (!any_fresh) return hung;
  for (const Heartbeat& h : beats) {
    if (h.age_s > timeout_s) hung.push_back(h.rank);
  }
  return hung;
}

bool job_is_silent(const std::vector<Heartbeat>& step_ages, double timeout_s) {
  return !step_ages.empty() && std::all_of(step_ages.begin(), step_ages.end(),
                                           [&](const Heartbeat& h) { return h.age_s > timeout_s; });
}

std::vector<Heartbeat> StepClock::step_ages(std::vector<Heartbeat> beats, double now_s) {
  for (Heartbeat& h : beats) {
    if (!h.seen) continue;
    auto it = last_.find(h.rank);
    if (it == last_.end() || it->second.first != h.step) {
      it = last_.insert_or_assign(h.rank, std::pair{h.step, now_s - h.age_s}).first;
    }
    h.age_s = std::max(0.0, now_s - it->second.second);
  }
  return beats;
}

std::optional<Completion> first_completed_step(const std::vector<Heartbeat>& beats) {
  std::optional<Completion> best;
  for (const Heartbeat& h : beats) {
    if (!h.seen || h.first_step <= 0) continue;
    const bool done = h.step > h.first_step || (h.step == h.first_step && h.phase == "end");
    if (!done) continue;
    if (!best || h.age_s > best->age_s) best = Completion{h.first_step, h.first_step - 1, h.age_s};
  }
  return best;
}

}  // namespace moetron::train
