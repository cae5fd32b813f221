// MOETRON_INJECT_FAILURE: the grammar, each kind's effect (the process-ending
// ones in a forked child), and the once-per-job markers under `launch`.
#include "moetron/train/fault_injection.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/launcher.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

TEST(FaultInjection, ParsesRankAndStepInEitherOrder) {
  EXPECT_TRUE(parse_injected_failures("").empty());
  auto f = parse_injected_failures("rank=1,step=0");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[0].step, 0);
  EXPECT_EQ(f[0].kind, FailureKind::error);
  EXPECT_EQ(f[0].at, FailurePoint::step);
  f = parse_injected_failures("step=12,rank=3");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 3);
  EXPECT_EQ(f[0].step, 12);
}

TEST(FaultInjection, ParsesListsKindsPointsAndTheOldSignalForm) {
  const auto f = parse_injected_failures(
      "rank=0,step=2,kind=kill;rank=1,step=5,kind=hang,at=persist;"
      "kind=slow,seconds=0.25,rank=2,step=1;rank=1,step=3,kind=disk-full;"
      "rank=3,step=4,kind=exit,at=snapshot;rank=0,step=1,signal=STOP;rank=0,step=7,signal=SEGV");
  ASSERT_EQ(f.size(), 7u);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i].index, static_cast<int>(i));
  EXPECT_EQ(f[0].kind, FailureKind::kill);
  EXPECT_EQ(f[1].kind, FailureKind::hang);
  EXPECT_EQ(f[1].at, FailurePoint::persist);
  EXPECT_EQ(f[2].kind, FailureKind::slow);
  EXPECT_DOUBLE_EQ(f[2].seconds, 0.25);
  EXPECT_EQ(f[2].rank, 2);
  EXPECT_EQ(f[3].kind, FailureKind::disk_full);
  EXPECT_EQ(f[4].kind, FailureKind::exit);
  EXPECT_EQ(f[4].at, FailurePoint::snapshot);
  EXPECT_EQ(f[5].kind, FailureKind::stop);
  EXPECT_EQ(f[6].kind, FailureKind::segv);
  EXPECT_EQ(parse_injected_failures("rank=1,step=2,signal=KILL")[0].kind, FailureKind::kill);
  EXPECT_EQ(failure_kind_name(FailureKind::disk_full), "disk-full");
  EXPECT_EQ(failure_point_name(FailurePoint::persist), "persist");
}

TEST(FaultInjection, MalformedValuesNameTheVariableAndTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"rank=1", "'step' is missing"},
      {"step=2", "'rank' is missing"},
      {"rank=x,step=2", "rank 'x'"},
      {"rank=1,step=-3", "step '-3'"},
      {"rank=1,step=2,rank=0", "'rank' given twice"},
      {"rank=1,stp=2", "unknown key 'stp'"},
      {"rank=1;step=2", "in failure 1 ('rank=1'), 'step' is missing"},
      {"rank 1", "not key=value"},
      {"rank=1,step=2,kind=explode", "kind 'explode' is not error, kill, hang"},
      {"rank=1,step=2,kind=kill,signal=KILL", "give kind or signal, not both"},
      {"rank=1,step=2,signal=HUP", "signal 'HUP' is not KILL, STOP or SEGV"},
      {"rank=1,step=2,at=later", "at 'later' is not step, snapshot or persist"},
      {"rank=1,step=2,kind=slow", "kind=slow needs seconds=X"},
      {"rank=1,step=2,kind=slow,seconds=0", "seconds '0' is not a number > 0"},
      {"rank=1,step=2,kind=slow,seconds=fast", "seconds 'fast'"},
      {"rank=1,step=2,seconds=3", "'seconds' goes with kind=slow only"},
      {"rank=1,step=2,kind=slow,seconds=1,at=persist", "kind slow takes no 'at'"},
      {"rank=1,step=0,at=snapshot", "step 0 (start-up) has no snapshot"},
      {"rank=1,step=2;;rank=0,step=1", "failure 2 is empty"},
      {"rank=1,step=2;rank=0,step=1,kind=bad", "in failure 2 ('rank=0,step=1,kind=bad')"},
  };
  for (const auto& [spec, why] : cases) {
    try {
      parse_injected_failures(spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("MOETRON_INJECT_FAILURE='" + std::string(spec) + "' is malformed"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << spec << ": " << msg;
      EXPECT_NE(msg.find("expected rank=R,step=S[,kind="), std::string::npos) << msg;
    }
  }
}

TEST(FaultInjection, ThrowsOnlyOnTheNamedRankStepAndPoint) {
  ::unsetenv(kLaunchLogDirEnv);
  ::unsetenv(kInjectFailureEnv);
  EXPECT_NO_THROW(maybe_inject_failure(1, 0));
  ::setenv(kInjectFailureEnv, "rank=1,step=4;rank=0,step=6,at=persist", 1);
  EXPECT_NO_THROW(maybe_inject_failure(0, 4));
  EXPECT_NO_THROW(maybe_inject_failure(1, 3));
  EXPECT_NO_THROW(maybe_inject_failure(1, 4, FailurePoint::snapshot));
  EXPECT_NO_THROW(maybe_inject_failure(0, 6));
  try {
    maybe_inject_failure(1, 4);
    ADD_FAILURE() << "no failure injected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure on rank 1 at step 4"), std::string::npos)
        << e.what();
  }
  // Without launch a one-shot failure fires whenever its step comes (as before markers).
  EXPECT_THROW(maybe_inject_failure(1, 4), Error);
  try {
    maybe_inject_failure(0, 6, FailurePoint::persist);
    ADD_FAILURE() << "no failure injected at persist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure on rank 0 at step 6 (persist)"),
              std::string::npos)
        << e.what();
  }
  ::setenv(kInjectFailureEnv, "rank=one", 1);
  EXPECT_THROW(maybe_inject_failure(0, 0), Error);  // malformed: an error on every rank
  ::unsetenv(kInjectFailureEnv);
}

TEST(FaultInjection, DiskFullFailsTheFirstWriteFromItsStepOnce) {
  ::unsetenv(kLaunchLogDirEnv);
  ::setenv(kInjectFailureEnv, "rank=1,step=3,kind=disk-full", 1);
  EXPECT_NO_THROW(maybe_fail_write(1, 2, "/x/step-2", FailurePoint::persist));
  EXPECT_NO_THROW(maybe_fail_write(0, 3, "/x/step-3", FailurePoint::persist));
  EXPECT_NO_THROW(maybe_inject_failure(1, 3));  // not a step failure
  try {
    maybe_fail_write(1, 4, "/x/step-4", FailurePoint::snapshot);  // armed at 3: any write after
    ADD_FAILURE() << "no disk-full failure";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("cannot write '/x/step-4': No space left on device (injected by "
                                   "MOETRON_INJECT_FAILURE on rank 1 at step 4)"),
        std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(maybe_fail_write(1, 5, "/x/step-5", FailurePoint::persist));  // once
  ::unsetenv(kInjectFailureEnv);
}

// at=persist: snapshot writes pass, the first checkpoint write fails (and
// at=snapshot the other way round).
TEST(FaultInjection, DiskFullCanNameWhichWritesFail) {
  ::unsetenv(kLaunchLogDirEnv);
  ::setenv(kInjectFailureEnv, "rank=0,step=4,kind=disk-full,at=persist", 1);
  EXPECT_NO_THROW(maybe_fail_write(0, 4, "/shm/step-4", FailurePoint::snapshot));
  EXPECT_THROW(maybe_fail_write(0, 4, "/run/step-4", FailurePoint::persist), Error);
  EXPECT_NO_THROW(maybe_fail_write(0, 6, "/run/step-6", FailurePoint::persist));  // once
  ::setenv(kInjectFailureEnv, "rank=0,step=4,kind=disk-full,at=snapshot", 1);
  EXPECT_NO_THROW(maybe_fail_write(0, 4, "/run/step-4", FailurePoint::persist));
  EXPECT_THROW(maybe_fail_write(0, 5, "/shm/step-5", FailurePoint::snapshot), Error);
  ::unsetenv(kInjectFailureEnv);
}

TEST(FaultInjection, SlowSleepsAtEveryStepFromItsOwn) {
  ::unsetenv(kLaunchLogDirEnv);
  ::setenv(kInjectFailureEnv, "rank=0,step=3,kind=slow,seconds=0.2", 1);
  auto timed = [](int rank, int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    maybe_inject_failure(rank, step);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  EXPECT_LT(timed(0, 2), 0.1);
  EXPECT_LT(timed(1, 3), 0.1);
  EXPECT_GE(timed(0, 3), 0.2);
  EXPECT_GE(timed(0, 4), 0.2);
  ::unsetenv(kInjectFailureEnv);
}

// Each kind that ends the process, in a child: how it ends.
int child_ending(const std::string& spec, double wait_s) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::setenv(kInjectFailureEnv, spec.c_str(), 1);
    try {
      maybe_inject_failure(0, 2);
    } catch (...) {
      ::_exit(42);
    }
    ::_exit(0);
  }
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return -1;  // still running: hung
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(FaultInjection, EachKindEndsTheProcessItsWay) {
  ::unsetenv(kLaunchLogDirEnv);
  EXPECT_EQ(child_ending("rank=0,step=2", 10), 42);  // error: an exception
  EXPECT_EQ(child_ending("rank=0,step=2,kind=kill", 10), 128 + SIGKILL);
  EXPECT_EQ(child_ending("rank=0,step=2,kind=exit", 10), 1);
  EXPECT_EQ(child_ending("rank=0,step=2,signal=KILL", 10), 128 + SIGKILL);
  EXPECT_EQ(child_ending("rank=0,step=2,kind=hang", 0.5), -1);
  EXPECT_EQ(child_ending("rank=0,step=3,kind=kill", 10), 0);  // not its step
}

// Under launch a failure fires once per job: the marker its rank creates
// before firing stops a restarted process from firing it again; launch
// removes the markers when it starts.
TEST(FaultInjection, UnderLaunchEachFailureFiresOnceAcrossRestarts) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_inject_" + std::to_string(::getpid()))).string();
  remove_tree(dir);
  fs::create_directories(dir);
  ::setenv(kLaunchLogDirEnv, dir.c_str(), 1);
  const std::string spec = "rank=0,step=2,kind=exit;rank=1,step=4";
  ::setenv(kInjectFailureEnv, spec.c_str(), 1);
  EXPECT_THROW(maybe_inject_failure(1, 4), Error);
  EXPECT_TRUE(fs::exists(dir + "/injected-1"));
  EXPECT_FALSE(fs::exists(dir + "/injected-0"));
  EXPECT_NO_THROW(maybe_inject_failure(1, 4));  // the restarted attempt passes step 4
  EXPECT_EQ(child_ending(spec, 10), 1);         // rank 0 exits at step 2 ...
  EXPECT_TRUE(fs::exists(dir + "/injected-0"));
  EXPECT_EQ(child_ending(spec, 10), 0);  // ... once: its marker exists
  ::unsetenv(kLaunchLogDirEnv);
  ::unsetenv(kInjectFailureEnv);
  remove_tree(dir);
}

}  // namespace
}  // namespace moetron::train
