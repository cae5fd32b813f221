// Per-rank heartbeats and how `launch` names a silent rank (train/heartbeat.h).
#include "moetron/train/heartbeat.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "moetron/comm/wait_hook.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/launcher.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

TEST(Heartbeat, RanksWriteTheirStepAndLaunchReadsIt) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_heartbeat_" + std::to_string(::getpid()))).string();
  remove_tree(dir);
  fs::create_directories(dir);
  ::unsetenv(kLaunchLogDirEnv);
  write_heartbeat(0, 1);  // not launched: nothing written
  EXPECT_TRUE(fs::is_empty(dir));
  ::setenv(kLaunchLogDirEnv, dir.c_str(), 1);
  write_heartbeat(0, 7);
  ::unsetenv(kLaunchLogDirEnv);
  const auto beats = read_heartbeats(dir, 2, now_seconds() - 30);
  ASSERT_EQ(beats.size(), 2u);
  EXPECT_TRUE(beats[0].seen);
  EXPECT_EQ(beats[0].step, 7);
  EXPECT_EQ(beats[0].pid, ::getpid());
  EXPECT_LT(beats[0].age_s, 10.0);
  EXPECT_FALSE(beats[1].seen);
  EXPECT_GE(beats[1].age_s, 30.0);  // never reported: silent since launch
  std::vector<int> blamed;
  const auto lines = describe_silent_ranks(beats, &blamed);
  ASSERT_EQ(blamed, std::vector<int>{1});
  EXPECT_NE(lines[0].find("rank 1 never reported a training step"), std::string::npos) << lines[0];
  remove_tree(dir);
}

TEST(Heartbeat, AStoppedRankIsNamedAsStopped) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ::kill(child, SIGSTOP);
  int status = 0;
  ::waitpid(child, &status, WUNTRACED);  // until it is stopped
  std::vector<Heartbeat> beats(3);
  for (int r = 0; r < 3; ++r) {
    beats[static_cast<size_t>(r)] = {r, true, 5, ::getpid(), 40.0, 'S', "start", 0};
  }
  beats[1] = {1, true, 5, child, 41.0, 'T', "start", 0};
  // read_heartbeats fills state from /proc: check that a stopped process reads 'T'.
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_heartbeat_stop_" + std::to_string(::getpid())))
          .string();
  fs::create_directories(dir);
  std::ofstream(dir + "/rank-0.heartbeat") << "5 " << child << "\n";
  EXPECT_EQ(read_heartbeats(dir, 1, now_seconds())[0].state, 'T');
  std::vector<int> blamed;
  const auto lines = describe_silent_ranks(beats, &blamed);
  EXPECT_EQ(blamed, std::vector<int>{1});
  EXPECT_NE(lines[0].find("rank 1 (pid " + std::to_string(child) + ") is stopped"),
            std::string::npos)
      << lines[0];
  // Without a stopped rank, the ranks at the lowest step are blamed.
  beats[1].state = 'S';
  beats[2].step = 4;
  blamed.clear();
  describe_silent_ranks(beats, &blamed);
  EXPECT_EQ(blamed, std::vector<int>{2});
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  remove_tree(dir);
}

// Runs `writes` in a child process (the first step is per process) with
// heartbeats going to `dir`.
void in_child(const std::string& dir, void (*writes)()) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::setenv(kLaunchLogDirEnv, dir.c_str(), 1);
    writes();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// "<step> <pid> <phase> <first>": the phase of the step, and the first step
// this process started (where a restarted rank resumed); the older
// "<step> <pid>" still reads.
TEST(Heartbeat, PhasesAndTheFirstStepAreWrittenAndOldLinesStillRead) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_heartbeat_phase_" + std::to_string(::getpid())))
          .string();
  remove_tree(dir);
  fs::create_directories(dir);
  in_child(dir, [] { write_heartbeat(0, 0); });
  auto b = read_heartbeats(dir, 1, now_seconds())[0];
  EXPECT_EQ(b.step, 0);
  EXPECT_EQ(b.phase, "start");
  EXPECT_EQ(b.first_step, 0);
  in_child(dir, [] {
    write_heartbeat(0, 0);
    write_heartbeat(0, 5);
    write_heartbeat(0, 5, HeartbeatPhase::end);
  });
  b = read_heartbeats(dir, 1, now_seconds())[0];
  EXPECT_EQ(b.step, 5);
  EXPECT_EQ(b.phase, "end");
  EXPECT_EQ(b.first_step, 5);
  in_child(dir, [] {
    write_heartbeat(0, 5);
    write_heartbeat(0, 6);
  });
  b = read_heartbeats(dir, 1, now_seconds())[0];
  EXPECT_EQ(b.step, 6);
  EXPECT_EQ(b.first_step, 5);                               // still the first one
  EXPECT_FALSE(fs::exists(dir + "/rank-0.heartbeat.tmp"));  // renamed into place
  std::ofstream(dir + "/rank-1.heartbeat") << "7 " << ::getpid() << "\n";
  b = read_heartbeats(dir, 2, now_seconds())[1];
  EXPECT_TRUE(b.seen);
  EXPECT_EQ(b.step, 7);
  EXPECT_EQ(b.phase, "start");
  EXPECT_EQ(b.first_step, 0);
  remove_tree(dir);
}

// start_heartbeats installs the communicators' wait hook when launched: it
// rewrites the heartbeat as "wait" at most once a second (kWaitBeatInterval).
TEST(Heartbeat, TheWaitHookBeatsAtMostOnceASecond) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_heartbeat_wait_" + std::to_string(::getpid())))
          .string();
  remove_tree(dir);
  fs::create_directories(dir);
  ::unsetenv(kLaunchLogDirEnv);
  comm::set_wait_hook(nullptr);
  start_heartbeats(0);
  EXPECT_EQ(comm::wait_hook(), nullptr);  // not launched: no hook
  ::setenv(kLaunchLogDirEnv, dir.c_str(), 1);
  start_heartbeats(0);
  const comm::WaitHook hook = comm::wait_hook();
  ASSERT_NE(hook, nullptr);
  write_heartbeat(0, 3);
  for (int i = 0; i < 1000; ++i) hook();  // within the second: no new beat
  EXPECT_EQ(read_heartbeats(dir, 1, now_seconds())[0].phase, "start");
  std::this_thread::sleep_for(std::chrono::duration<double>(kWaitBeatInterval + 0.05));
  hook();
  const Heartbeat b = read_heartbeats(dir, 1, now_seconds())[0];
  EXPECT_EQ(b.phase, "wait");
  EXPECT_EQ(b.step, 3);  // the step it waits in
  EXPECT_LT(b.age_s, 1.0);
  EXPECT_NE(describe_stale_rank(b).find("waiting in a collective in step 3"), std::string::npos)
      << describe_stale_rank(b);
  comm::set_wait_hook(nullptr);
  ::unsetenv(kLaunchLogDirEnv);
  remove_tree(dir);
}

TEST(Heartbeat, SignalsHaveNames) {
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(signal_name(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signal_name(SIGSTOP), "SIGSTOP");
}

}  // namespace
}  // namespace moetron::train
