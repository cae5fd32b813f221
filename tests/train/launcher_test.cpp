// `moetron launch` and rank failure, end to end: the real binary under the
// real mpirun, on a tiny corpus this test prepares itself.
#include "moetron/train/launcher.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

const std::string& root() {
  static const std::string dir = [] {
    const std::string r =
        (fs::temp_directory_path() / ("moetron_launcher_" + std::to_string(::getpid()))).string();
    remove_tree(r);
    fs::create_directories(r + "/text");
    std::ofstream f(r + "/text/notes");
    const char* words[] = {"red",  "fox",   "runs", "past", "old",
                           "barn", "under", "grey", "sky",  "slowly"};
    for (int d = 0; d < 300; ++d) {
      f << words[d % 10] << " " << words[(d * 7) % 10] << " " << words[(d * 3 + 1) % 10]
        << ".\n%\n";
    }
    return r;
  }();
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Outcome {
  int code = -1;
  double seconds = 0;
  std::string out, err;
};

// Runs `cmd` through the shell, stdout and stderr captured apart.
Outcome run(const std::string& cmd) {
  static int n = 0;
  const std::string base = root() + "/cmd" + std::to_string(n++);
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system((cmd + " >" + base + ".out 2>" + base + ".err").c_str());
  Outcome r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

const std::string& corpus() {
  static const std::string dir = [] {
    const std::string d = root() + "/prepared";
    const Outcome r = run(std::string(MOETRON_BINARY) + " prepare-data --input " + root() +
                          "/text --out " + d + " --vocab-size 300 --val-fraction 0.1");
    if (r.code != 0) throw Error("prepare-data failed: " + r.err);
    return d;
  }();
  return dir;
}

std::string train_args(const std::string& out, int steps) {
  return "train --config " MOETRON_SOURCE_DIR "/configs/tiny.toml --out " + out +
         " --set data.path=" + corpus() + " --set train.steps=" + std::to_string(steps) +
         " --set train.log_every=1";
}

const std::string kRootEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";

TEST(LaunchPlan, FlagsFollowRanksAndCores) {
  LaunchOptions o;
  o.mpirun = "/x/mpirun";
  o.program = "/x/moetron";
  o.command = {"train", "--config", "c.toml", "--out", "runs/a"};
  o.cores = 2;
  o.ranks = 2;
  LaunchPlan p = plan_launch(o);
  auto has = [&](const std::string& a) {
    return std::find(p.argv.begin(), p.argv.end(), a) != p.argv.end();
  };
  EXPECT_EQ(p.argv[0], "/x/mpirun");
  EXPECT_EQ(p.run_dir, "runs/a");
  EXPECT_EQ(p.threads_per_rank, 1);
  EXPECT_FALSE(p.oversubscribed);
  EXPECT_FALSE(has("--oversubscribe"));
  EXPECT_FALSE(has("--bind-to"));  // one thread on its own core: mpirun's core binding is right
  EXPECT_TRUE(has("OMP_NUM_THREADS=1"));
  EXPECT_EQ(p.argv[p.argv.size() - 2], "--set");
  EXPECT_EQ(p.argv.back(), "train.threads=1");  // last: overrides the config's

  o.ranks = 4;
  p = plan_launch(o);
  EXPECT_TRUE(p.oversubscribed);
  EXPECT_TRUE(has("--oversubscribe"));
  EXPECT_TRUE(has("none"));
  EXPECT_EQ(p.threads_per_rank, 1);

  o.ranks = 1;
  p = plan_launch(o);
  EXPECT_EQ(p.threads_per_rank, 2);
  EXPECT_TRUE(has("--bind-to"));  // two threads must not share one bound core
  o.threads_per_rank = 3;
  p = plan_launch(o);
  EXPECT_TRUE(has("OMP_NUM_THREADS=3"));
  EXPECT_EQ(::geteuid() == 0, !p.env.empty());
}

TEST(LaunchPlan, BadArgumentsAreErrorsThatSayWhat) {
  LaunchOptions o;
  o.mpirun = "/x/mpirun";
  o.command = {"train", "--config", "c.toml"};
  try {
    plan_launch(o);
    ADD_FAILURE() << "no --out accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no --out RUN"), std::string::npos) << e.what();
  }
  o.command = {"train", "--out=r"};
  EXPECT_EQ(plan_launch(o).run_dir, "r");
  o.ranks = 0;
  EXPECT_THROW(plan_launch(o), Error);
  o.ranks = 1;
  o.command.clear();
  EXPECT_THROW(plan_launch(o), Error);
  const std::string empty = root() + "/empty_path";
  fs::create_directories(empty);
  const std::string saved = std::getenv("PATH");
  ::setenv("PATH", empty.c_str(), 1);
  try {
    find_on_path("mpirun");
    ADD_FAILURE() << "mpirun found on an empty PATH";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'mpirun' not found on PATH (" + empty + ")"),
              std::string::npos)
        << e.what();
  }
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_FALSE(find_on_path("mpirun").empty());
}

TEST(Launch, TwoRanksTrainWithLogsPerRankThenResume) {
  const std::string out = root() + "/run_ok";
  Outcome r = run(std::string(MOETRON_BINARY) + " launch -n 2 -- " + train_args(out, 3));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("trained 3 steps"), std::string::npos)
      << "rank 0 not on the console: " << r.out;
  EXPECT_NE(r.out.find("step     3/3"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("launch: 2 ranks x 1 threads"), std::string::npos) << r.err;
  EXPECT_NE(slurp(out + "/logs/rank-0.log").find("trained 3 steps"), std::string::npos);
  for (int rank : {0, 1}) {
    const std::string log = slurp(out + "/logs/rank-" + std::to_string(rank) + ".log");
    EXPECT_NE(log.find("=== launch"), std::string::npos) << "rank " << rank << ": " << log;
  }
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step-3"));
  // A second launch into the same run appends to the logs.
  r = run("MOETRON_INJECT_FAILURE=rank=1,step=0 " + std::string(MOETRON_BINARY) +
          " launch -n 2 -- " + train_args(out, 3) + " --resume");
  EXPECT_NE(r.code, 0);
  const std::string log0 = slurp(out + "/logs/rank-0.log");
  EXPECT_NE(log0.find("trained 3 steps"), std::string::npos) << log0;
  EXPECT_NE(log0.find("=== launch", log0.find("trained 3 steps")), std::string::npos) << log0;
}

// Rank 0 has 100000 steps to train: the run ends quickly only if rank 1's
// failure takes it down.
TEST(Launch, AFailingRankEndsTheLaunchFastAndIsNamed) {
  const std::string out = root() + "/run_fail";
  const Outcome r = run("MOETRON_INJECT_FAILURE=rank=1,step=0 timeout 120 " +
                        std::string(MOETRON_BINARY) + " launch -n 2 -- " + train_args(out, 100000));
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "launch hung until the timeout";
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.err.find("launch: rank 1 failed"), std::string::npos) << r.err;
  EXPECT_NE(
      r.err.find("rank 1: error: MOETRON_INJECT_FAILURE: injected failure on rank 1 at step 0"),
      std::string::npos)
      << "the failing rank's last log lines: " << r.err;
  EXPECT_NE(slurp(out + "/logs/rank-1.log").find("injected failure"), std::string::npos);
}

// mpirun may kill the job before it forwards a failing rank's last output:
// the rank's rank-R.error file still names it. A stand-in program (a shell
// script under the real mpirun) fails on rank 1 without printing anything.
TEST(Launch, ARankErrorFileNamesTheRankWhenItsOutputIsLost) {
  const std::string out = root() + "/run_silent";
  const std::string script = root() + "/silent_failure.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n"
         "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then\n"
         "  echo 'rank 1: error: the message mpirun never forwarded' > "
         "\"$MOETRON_LAUNCH_LOG_DIR/rank-1.error\"\n"
         "  exit 3\n"
         "fi\n"
         "sleep 60\n";
  }
  fs::permissions(script, fs::perms::owner_all);
  LaunchOptions o;
  o.ranks = 2;
  o.program = script;
  o.command = {"train", "--out", out};
  testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  const int code = launch(o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(code, 0);
  EXPECT_LT(seconds, 30.0) << "rank 0 was not ended with the job";
  EXPECT_NE(err.find("launch: rank 1 failed"), std::string::npos) << err;
  EXPECT_NE(err.find("the message mpirun never forwarded"), std::string::npos) << err;
  EXPECT_NE(slurp(out + "/logs/rank-1.log").find("the message mpirun never forwarded"),
            std::string::npos);
}

TEST(Launch, DirectMpirunAbortsEveryRankWhenOneFails) {
  const std::string out = root() + "/run_direct";
  const Outcome r =
      run(kRootEnv +
          "MOETRON_INJECT_FAILURE=rank=1,step=0 OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 " +
          "--oversubscribe " + MOETRON_BINARY + " " + train_args(out, 100000));
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "mpirun hung until the timeout";
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.err.find("rank 1: error:"), std::string::npos) << r.err;
}

TEST(Launch, MalformedInjectionIsAnErrorOnEveryRank) {
  const Outcome r = run(
      kRootEnv + "MOETRON_INJECT_FAILURE=rank=1,stp=0 timeout 120 mpirun -np 2 --oversubscribe " +
      MOETRON_BINARY + " " + train_args(root() + "/run_bad", 3));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124);
  EXPECT_NE(r.err.find("MOETRON_INJECT_FAILURE='rank=1,stp=0' is malformed: unknown key 'stp'"),
            std::string::npos)
      << r.err;
}

TEST(LaunchPlan, AHostfileGoesToMpirun) {
  const std::string hosts = root() + "/hosts";
  std::ofstream(hosts) << "node1 slots=4\nnode2 slots=4\n";
  LaunchOptions o;
  o.mpirun = "/x/mpirun";
  o.program = "/x/moetron";
  o.command = {"train", "--out", "runs/a"};
  o.ranks = 8;
  o.hostfile = hosts;
  const LaunchPlan p = plan_launch(o);
  const auto at = std::find(p.argv.begin(), p.argv.end(), "--hostfile");
  ASSERT_NE(at, p.argv.end());
  EXPECT_EQ(*(at + 1), fs::absolute(hosts).string());
  o.hostfile = root() + "/no_such_hostfile";
  EXPECT_THROW(plan_launch(o), Error);
}

// A rank killed by a signal is named with the signal, not an exit code.
TEST(Launch, ARankKilledByASignalIsNamedWithTheSignal) {
  const std::string out = root() + "/run_killed";
  const Outcome r = run("MOETRON_INJECT_FAILURE=rank=1,step=2,signal=KILL timeout 120 " +
                        std::string(MOETRON_BINARY) + " launch -n 2 -- " + train_args(out, 100000));
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "launch hung until the timeout";
  EXPECT_NE(r.err.find("launch: rank 1 was killed by SIGKILL (signal 9)"), std::string::npos)
      << r.err;
}

// A stopped rank leaves the others waiting in a collective: launch names it
// after --silent-timeout and ends the job.
TEST(Launch, AStoppedRankIsNamedAfterTheSilentTimeout) {
  const std::string out = root() + "/run_stopped";
  const Outcome r = run("MOETRON_INJECT_FAILURE=rank=1,step=3,signal=STOP timeout 120 " +
                        std::string(MOETRON_BINARY) + " launch -n 2 --silent-timeout 10 -- " +
                        train_args(out, 100000));
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "launch hung until the timeout";
  EXPECT_LT(r.seconds, 90.0);
  EXPECT_NE(r.err.find("no rank has started a training step for 10 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is stopped"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moetron::train
