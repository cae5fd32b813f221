// What `moetron launch`'s supervisor decides, as pure functions of what it
// observed (heartbeats, how an attempt ended, the elastic files under
// RUN/logs), so each rule is tested without running a job. The supervisor
// itself (train/supervisor.cpp) only observes, asks these, and acts.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "moetron/train/heartbeat.h"

namespace moetron::train {

// How one attempt (one mpirun) ended.
enum class AttemptEnd {
  finished,            // every rank exited 0
  failed,              // a rank exited non-zero or died by a signal
  hung,                // the supervisor stopped it: a rank's heartbeat went stale
  silent,              // the supervisor stopped it: no rank started a step (--silent-timeout)
  stopped_for_resize,  // the ranks stopped at a step as asked (RUN/logs/stopped-for-resize)
};

struct RankFailure {
  int rank = -1;       // -1: mpirun failed without naming a rank
  std::string cause;   // "SIGKILL", "exit code 1", "error", "hung", "silent", "mpirun exit code 1"
  std::string detail;  // the rank's error message, or what its heartbeat said
  int64_t last_step = 0;  // from its heartbeat (0: it had not started a training step)
};

struct AttemptOutcome {
  AttemptEnd end = AttemptEnd::finished;
  int code = 0;  // launch's exit code if this attempt is the last
  std::vector<RankFailure> failures;
  int64_t stopped_step = -1;  // stopped_for_resize: the step the ranks stopped after
};

// "rank 1: SIGKILL at step 4", "rank 0: error at step 2 (rank 0: error: ...)".
std::string describe_failure(const RankFailure& f);

// RUN/logs/unavailable (one rank number per line: that rank's slot is gone)
// and RUN/logs/capacity (one number: the ranks available now; when present
// it supersedes the unavailable list, being the newer report).
struct ElasticFiles {
  std::set<int> unavailable;
  std::optional<int> capacity;
};
// Absent files read as empty; a line that is not an integer >= 0 is an
// error naming the file and the line.
ElasticFiles read_elastic_files(const std::string& log_dir);

struct SupervisorLimits {
  int ranks = 1;  // -n: the job's full size
  int max_restarts = 0;
  int min_ranks = 0;  // --min-ranks; 0: not elastic (the elastic files are ignored)
};

// The ranks the next attempt can have: min(N, capacity) when capacity is
// known, else N minus the unavailable ranks in [0, N); N when not elastic.
int usable_ranks(const SupervisorLimits& limits, const ElasticFiles& files);

// While an attempt runs with `current_ranks`: whether returned capacity
// lets the job grow (then the supervisor asks the ranks to stop for a resize).
bool wants_to_grow(const SupervisorLimits& limits, const ElasticFiles& files, int current_ranks);

enum class NextStep { done, restart, resize, give_up };
struct Decision {
  NextStep next = NextStep::done;
  int ranks = 0;    // restart, resize: the next attempt's rank count
  std::string why;  // give_up: the reason (empty: --max-restarts 0, report as before)
};

// After an attempt with `current_ranks` that was preceded by `restarts_done`
// restarts. A resize is not a restart: it does not count against --max-restarts.
Decision decide_next(const AttemptOutcome& outcome, int current_ranks, int restarts_done,
                     const SupervisorLimits& limits, const ElasticFiles& files);

// Ranks whose heartbeat is older than `timeout_s` while another rank's is
// fresher (ranks waiting in a collective for a hung rank keep beating). A
// rank not heard from since the attempt started counts by that age. When
// every rank is stale nobody is named: that is a silent job (--silent-timeout).
std::vector<int> hung_ranks(const std::vector<Heartbeat>& beats, double timeout_s);

// Whether every rank has gone `timeout_s` without starting a new step;
// `step_ages` from StepClock.
bool job_is_silent(const std::vector<Heartbeat>& step_ages, double timeout_s);

// When each rank last moved to a new step, from successive heartbeat reads
// (a "wait" beat rewrites the file without a new step, so the file's age no
// longer says when the step started).
class StepClock {
 public:
  // The beats with age_s replaced by the seconds since each rank's step
  // last changed (first seen: since its beat was written; never seen: since
  // the attempt started, as read_heartbeats says).
  std::vector<Heartbeat> step_ages(std::vector<Heartbeat> beats, double now_s);

 private:
  std::map<int, std::pair<int64_t, double>> last_;  // rank -> (step, when it changed)
};

// The first training step a restarted job completed, from its heartbeats:
// a rank whose first step (Heartbeat::first_step) has ended, or that has
// started a later one (then it completed at least `age_s` ago).
struct Completion {
  int64_t step = 0;          // the first step completed
  int64_t resumed_from = 0;  // step - 1: the state the attempt started from
  double age_s = 0;          // how long ago the heartbeat that shows it was written
};
std::optional<Completion> first_completed_step(const std::vector<Heartbeat>& beats);

}  // namespace moetron::train
