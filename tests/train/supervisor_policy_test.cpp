// The supervisor's decisions (train/supervisor_policy.h) from what it
// observed: restart, resize, give up; hung and silent ranks; recovery.
#include "moetron/train/supervisor_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

AttemptOutcome ended(AttemptEnd end) {
  AttemptOutcome o;
  o.end = end;
  o.code = end == AttemptEnd::finished ? 0 : 1;
  if (end != AttemptEnd::finished && end != AttemptEnd::stopped_for_resize)
    o.failures = {{1, "SIGKILL", "", 4}};
  return o;
}

TEST(SupervisorPolicy, RestartsUntilMaxRestartsThenGivesUp) {
  const SupervisorLimits limits{4, 2, 0};
  const ElasticFiles none;
  EXPECT_EQ(decide_next(ended(AttemptEnd::finished), 4, 0, limits, none).next, NextStep::done);
  for (AttemptEnd e : {AttemptEnd::failed, AttemptEnd::hung, AttemptEnd::silent}) {
    Decision d = decide_next(ended(e), 4, 0, limits, none);
    EXPECT_EQ(d.next, NextStep::restart);
    EXPECT_EQ(d.ranks, 4);
    EXPECT_EQ(decide_next(ended(e), 4, 1, limits, none).next, NextStep::restart);
    d = decide_next(ended(e), 4, 2, limits, none);
    EXPECT_EQ(d.next, NextStep::give_up);
    EXPECT_NE(d.why.find("all 2 restarts (--max-restarts) made"), std::string::npos) << d.why;
  }
  // --max-restarts 0: give up at once, with no reason of its own (reported as before).
  const Decision d = decide_next(ended(AttemptEnd::failed), 4, 0, {4, 0, 0}, none);
  EXPECT_EQ(d.next, NextStep::give_up);
  EXPECT_TRUE(d.why.empty());
}

TEST(SupervisorPolicy, WithoutMinRanksTheElasticFilesAreIgnored) {
  ElasticFiles files;
  files.unavailable = {1, 2};
  files.capacity = 1;
  const SupervisorLimits limits{4, 3, 0};
  EXPECT_EQ(usable_ranks(limits, files), 4);
  EXPECT_FALSE(wants_to_grow(limits, files, 2));
  const Decision d = decide_next(ended(AttemptEnd::failed), 4, 0, limits, files);
  EXPECT_EQ(d.next, NextStep::restart);
  EXPECT_EQ(d.ranks, 4);
}

TEST(SupervisorPolicy, ElasticRestartsDropUnavailableRanksDownToMinRanks) {
  const SupervisorLimits limits{4, 3, 2};
  ElasticFiles files;
  files.unavailable = {3};
  Decision d = decide_next(ended(AttemptEnd::failed), 4, 0, limits, files);
  EXPECT_EQ(d.next, NextStep::restart);
  EXPECT_EQ(d.ranks, 3);
  files.unavailable = {1, 3, 9};  // 9 is not a rank of this job
  EXPECT_EQ(usable_ranks(limits, files), 2);
  EXPECT_EQ(decide_next(ended(AttemptEnd::hung), 3, 1, limits, files).ranks, 2);
  files.unavailable = {0, 1, 3};
  d = decide_next(ended(AttemptEnd::failed), 2, 1, limits, files);
  EXPECT_EQ(d.next, NextStep::give_up);
  EXPECT_NE(d.why.find("only 1 of 4 ranks are usable (unavailable: 0 1 3), fewer than "
                       "--min-ranks 2"),
            std::string::npos)
      << d.why;
}

TEST(SupervisorPolicy, ReturnedCapacityGrowsTheJobByAResizeThatIsNotARestart) {
  const SupervisorLimits limits{4, 1, 2};
  ElasticFiles files;
  files.unavailable = {2, 3};
  EXPECT_FALSE(wants_to_grow(limits, files, 2));  // no capacity file: nothing returned
  files.capacity = 2;
  EXPECT_FALSE(wants_to_grow(limits, files, 2));
  files.capacity = 3;  // supersedes the unavailable list
  EXPECT_TRUE(wants_to_grow(limits, files, 2));
  EXPECT_EQ(usable_ranks(limits, files), 3);
  files.capacity = 8;  // never beyond -n
  EXPECT_EQ(usable_ranks(limits, files), 4);
  EXPECT_FALSE(wants_to_grow(limits, files, 4));
  AttemptOutcome stopped = ended(AttemptEnd::stopped_for_resize);
  stopped.stopped_step = 7;
  // Both restarts are used: a resize still goes ahead.
  const Decision d = decide_next(stopped, 2, 1, limits, files);
  EXPECT_EQ(d.next, NextStep::resize);
  EXPECT_EQ(d.ranks, 4);
  files.capacity = 1;  // shrunk below --min-ranks meanwhile
  EXPECT_EQ(decide_next(stopped, 2, 0, limits, files).next, NextStep::give_up);
}

TEST(SupervisorPolicy, ElasticFilesAreReadAndBadLinesNamed) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_elastic_" + std::to_string(::getpid()))).string();
  remove_tree(dir);
  fs::create_directories(dir);
  ElasticFiles f = read_elastic_files(dir);
  EXPECT_TRUE(f.unavailable.empty());
  EXPECT_FALSE(f.capacity.has_value());
  std::ofstream(dir + "/unavailable") << "3\n\n1  # node b went away\n3\n";
  std::ofstream(dir + "/capacity") << "4\n";
  f = read_elastic_files(dir);
  EXPECT_EQ(f.unavailable, (std::set<int>{1, 3}));
  EXPECT_EQ(f.capacity, 4);
  std::ofstream(dir + "/unavailable") << "1\nnode-b\n";
  try {
    read_elastic_files(dir);
    ADD_FAILURE() << "a bad line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/unavailable' line 2: 'node-b' is not an integer"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(dir + "/unavailable") << "1\n";
  std::ofstream(dir + "/capacity") << "4\n5\n";
  EXPECT_THROW(read_elastic_files(dir), Error);
  remove_tree(dir);
}

Heartbeat beat(int rank, int64_t step, double age, const std::string& phase = "start") {
  Heartbeat h;
  h.rank = rank;
  h.seen = true;
  h.step = step;
  h.pid = 100 + rank;
  h.age_s = age;
  h.phase = phase;
  return h;
}

TEST(SupervisorPolicy, AHungRankIsStaleWhileOthersAreFresh) {
  std::vector<Heartbeat> beats = {beat(0, 5, 0.4, "wait"), beat(1, 5, 7.0), beat(2, 5, 0.9)};
  EXPECT_EQ(hung_ranks(beats, 5), std::vector<int>{1});
  EXPECT_TRUE(hung_ranks(beats, 7).empty());  // at the timeout: not yet
  Heartbeat never;                            // a rank not heard from since the attempt started
  never.rank = 3;
  never.age_s = 9;
  beats.push_back(never);
  EXPECT_EQ(hung_ranks(beats, 5), (std::vector<int>{1, 3}));
  for (Heartbeat& h : beats) h.age_s = 8;  // all stale: a silent job, nobody hung
  EXPECT_TRUE(hung_ranks(beats, 5).empty());
  EXPECT_NE(describe_stale_rank(beat(1, 5, 7.0))
                .find("rank 1 (pid 101) sent no heartbeat for 7 s (last: started step 5)"),
            std::string::npos);
}

TEST(SupervisorPolicy, SilenceIsMeasuredFromTheLastNewStepNotTheLastBeat) {
  StepClock clock;
  // t=100: rank 0 started step 3 two seconds ago; rank 1 waits in it.
  auto ages = clock.step_ages({beat(0, 3, 2.0), beat(1, 3, 0.5, "wait")}, 100);
  EXPECT_DOUBLE_EQ(ages[0].age_s, 2.0);
  EXPECT_DOUBLE_EQ(ages[1].age_s, 0.5);
  EXPECT_FALSE(job_is_silent(ages, 10));
  // t=111: both beat "wait" a moment ago, still in step 3.
  ages = clock.step_ages({beat(0, 3, 0.2, "wait"), beat(1, 3, 0.3, "wait")}, 111);
  EXPECT_DOUBLE_EQ(ages[0].age_s, 13.0);
  EXPECT_DOUBLE_EQ(ages[1].age_s, 11.5);
  EXPECT_TRUE(job_is_silent(ages, 10));
  // t=112: rank 1 starts step 4.
  ages = clock.step_ages({beat(0, 3, 0.2, "wait"), beat(1, 4, 0.1)}, 112);
  EXPECT_NEAR(ages[1].age_s, 0.1, 1e-9);
  EXPECT_FALSE(job_is_silent(ages, 10));
  EXPECT_FALSE(job_is_silent({}, 10));
}

TEST(SupervisorPolicy, RecoveryIsTheFirstStepARestartedRankCompleted) {
  Heartbeat startup = beat(0, 0, 1.0);  // started, no step yet
  EXPECT_FALSE(first_completed_step({startup}).has_value());
  Heartbeat started = beat(0, 4, 0.5);
  started.first_step = 4;
  EXPECT_FALSE(first_completed_step({started}).has_value());
  Heartbeat waiting = beat(1, 4, 0.1, "wait");
  waiting.first_step = 4;
  EXPECT_FALSE(first_completed_step({started, waiting}).has_value());
  Heartbeat done = beat(0, 4, 0.3, "end");
  done.first_step = 4;
  auto c = first_completed_step({done, waiting});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step, 4);
  EXPECT_EQ(c->resumed_from, 3);
  EXPECT_DOUBLE_EQ(c->age_s, 0.3);
  // A rank already in step 5 completed step 4 at least its beat's age ago;
  // the oldest evidence wins.
  Heartbeat later = beat(1, 5, 0.6);
  later.first_step = 4;
  c = first_completed_step({done, later});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step, 4);
  EXPECT_DOUBLE_EQ(c->age_s, 0.6);
}

TEST(SupervisorPolicy, FailuresAreDescribedWithRankCauseAndStep) {
  EXPECT_EQ(describe_failure({1, "SIGKILL", "", 4}), "rank 1: SIGKILL at step 4");
  EXPECT_EQ(describe_failure({0, "error", "rank 0: error: boom", 2}),
            "rank 0: error at step 2 (rank 0: error: boom)");
  EXPECT_EQ(describe_failure({-1, "mpirun exit code 3", "", 0}), "mpirun exit code 3 at step 0");
}

}  // namespace
}  // namespace moetron::train
