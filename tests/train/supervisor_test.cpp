// `moetron launch --max-restarts`: the real binary under the real mpirun
// fails by MOETRON_INJECT_FAILURE, is stopped, relaunched with --resume and
// finishes by itself; the elastic side (--min-ranks) with a stand-in rank
// program (a shell script that beats and acts out losing and regaining a
// rank): the supervisor's decisions alone. The trainer's half of a resize
// (resharded state, every sample once) is tested in elastic_mpitest.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "moetron/core/staged_dir.h"
#include "moetron/train/launcher.h"
#include "util/subprocess.h"
#include "util/tiny_corpus.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;
  double seconds = 0;
  std::string out, err;
};

// Runs `cmd` through the shell, stdout and stderr captured apart.
Outcome run(const std::string& cmd) {
  static int n = 0;
  const std::string base = test::tiny_corpus_root() + "/cmd" + std::to_string(n++);
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system((cmd + " >" + base + ".out 2>" + base + ".err").c_str());
  Outcome r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = test::read_text_file(base + ".out");
  r.err = test::read_text_file(base + ".err");
  return r;
}

std::string run_dir(const std::string& name) {
  return test::tiny_corpus_root() + "/" + name;
}

// `moetron launch -n 2 <launch_flags> -- train ...`: 8 steps of the tiny
// model, a checkpoint after every step; `inject` is MOETRON_INJECT_FAILURE.
// `sets` replaces the checkpoint settings (" --set key=value ...").
Outcome launch_tiny(const std::string& out, const std::string& launch_flags,
                    const std::string& inject = "",
                    const std::string& sets = " --set checkpoint.every=1") {
  const std::string env = inject.empty() ? "" : "MOETRON_INJECT_FAILURE='" + inject + "' ";
  return run(env + "timeout 120 " + MOETRON_BINARY + " launch -n 2 --threads-per-rank 1 " +
             launch_flags + " -- train --config " MOETRON_SOURCE_DIR "/configs/tiny.toml --out " +
             out + " --set data.path=" + test::tiny_corpus_root() +
             "/prepared --set train.steps=8" + sets);
}

std::vector<nlohmann::json> events(const std::string& out, const std::string& kind) {
  std::vector<nlohmann::json> found;
  std::ifstream f(out + "/events.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);  // throws on a torn line
    if (j.at("kind") == kind) found.push_back(j);
  }
  return found;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The uninterrupted run the restarted ones are compared with (once per process).
const std::string& reference_run() {
  static const std::string out = [] {
    const std::string dir = run_dir("reference");
    const Outcome r = launch_tiny(dir, "");
    if (r.code != 0) throw std::runtime_error("the reference run failed: " + r.err);
    return dir;
  }();
  return out;
}

void expect_same_final_weights(const std::string& out) {
  const std::string mine = test::read_text_file(out + "/checkpoints/step-8/model.safetensors");
  const std::string ref =
      test::read_text_file(reference_run() + "/checkpoints/step-8/model.safetensors");
  ASSERT_FALSE(ref.empty());
  EXPECT_TRUE(mine == ref) << "the final weights of " << out
                           << " differ from the uninterrupted run's";
}

// (a) A rank killed at a random step: the job restarts from the newest
// checkpoint by itself and ends with the uninterrupted run's weights, bit
// for bit; events.jsonl tells the story.
TEST(Supervisor, AKilledRankIsRestartedAndTheRunEndsBitIdentical) {
  const char* seed_env = std::getenv("MOETRON_TEST_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::atoi(seed_env)) : 20261205u;
  std::mt19937 rng(seed);
  const int rank = static_cast<int>(rng() % 2), step = 1 + static_cast<int>(rng() % 8);
  const std::string inject =
      "rank=" + std::to_string(rank) + ",step=" + std::to_string(step) + ",kind=kill";
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + inject);
  reference_run();
  const std::string out = run_dir("killed");
  const Outcome r = launch_tiny(out, "--max-restarts 3", inject);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("launch: restart 1 of 3 (attempt 2): relaunching 2 ranks with --resume "
                       "after rank " +
                       std::to_string(rank) + ": SIGKILL at step " + std::to_string(step)),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("trained"), std::string::npos) << r.out;
  expect_same_final_weights(out);
  const auto failures = events(out, "failure");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0]["attempt"], 1);
  EXPECT_EQ(failures[0]["rank"], rank);
  EXPECT_EQ(failures[0]["cause"], "SIGKILL");
  EXPECT_EQ(failures[0]["last_step"], step);
  const auto restarts = events(out, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["attempt"], 2);
  EXPECT_EQ(restarts[0]["ranks"], 2);
  const auto recovered = events(out, "recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["resumed_from"], step - 1);  // a checkpoint after every step
  EXPECT_EQ(recovered[0]["step"], step);
  EXPECT_GT(recovered[0]["seconds"].get<double>(), 0.0);
  EXPECT_LT(recovered[0]["seconds"].get<double>(), 60.0);
  // The relaunched trainer counts the restart and times its own recovery
  // from the detection the supervisor passed (up to its first step's end,
  // as the event's seconds; the two clocks differ by a heartbeat read).
  nlohmann::json last;
  std::ifstream metrics(out + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) last = nlohmann::json::parse(line);
  ASSERT_TRUE(last.contains("series")) << last.dump();
  EXPECT_EQ(last["series"].value("moetron_restarts_total", -1.0), 1.0) << last.dump();
  const double recovery_s = last["series"].value("moetron_recovery_seconds", -1.0);
  EXPECT_GT(recovery_s, 0.0);
  EXPECT_NEAR(recovery_s, recovered[0]["seconds"].get<double>(), 2.0);
  // Each attempt is marked in every rank's log.
  const std::string log1 = test::read_text_file(out + "/logs/rank-1.log");
  EXPECT_EQ(count_of(log1, "=== launch "), 2u) << log1;
  EXPECT_NE(log1.find(", attempt 2 at "), std::string::npos) << log1;
  EXPECT_NE(log1.find("=== attempt 1 failed: rank " + std::to_string(rank) + ": SIGKILL"),
            std::string::npos)
      << log1;
}

// (a') A rank killed while writing its in-memory snapshot of step 5 (its
// files written, the snapshot not yet agreed by every rank), with no disk
// checkpoint before the end: the relaunch resumes from the last complete
// snapshot (step 4), never the half-made one, and ends bit-identical.
TEST(Supervisor, AKillDuringTheSnapshotCopyResumesTheLastCompleteSnapshot) {
  reference_run();
  const std::string out = run_dir("killed_in_snapshot");
  const Outcome r = launch_tiny(out, "--max-restarts 2", "rank=1,step=5,kind=kill,at=snapshot",
                                " --set checkpoint.every=0 --set checkpoint.snapshot_every=1"
                                " --set checkpoint.snapshot_dir=" +
                                    test::tiny_corpus_root() + "/shm-killed-in-snapshot");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto failures = events(out, "failure");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0]["rank"], 1);
  EXPECT_EQ(failures[0]["cause"], "SIGKILL");
  const auto resumes = events(out, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0]["source"], "snapshot") << resumes[0].dump();
  EXPECT_EQ(resumes[0]["step"], 4) << resumes[0].dump();
  const auto recovered = events(out, "recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["resumed_from"], 4);
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step-4")) << "no disk checkpoint was asked for";
  expect_same_final_weights(out);
}

// (a'') The disk fills while rank 0 persists step 4's checkpoint in the
// background (snapshots every step, a checkpoint every 2): a warning and a
// checkpoint_failed event, no restart, step 4 never published, step 2 kept,
// and training goes on to the uninterrupted run's weights.
TEST(Supervisor, ADiskFullPersistWarnsKeepsThePreviousCheckpointAndTrainingGoesOn) {
  reference_run();
  const std::string out = run_dir("disk_full_persist");
  const Outcome r =
      launch_tiny(out, "--max-restarts 1", "rank=0,step=4,kind=disk-full,at=persist",
                  " --set checkpoint.every=2 --set checkpoint.keep=4"
                  " --set checkpoint.snapshot_every=1 --set checkpoint.snapshot_dir=" +
                      test::tiny_corpus_root() + "/shm-disk-full");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string log0 = test::read_text_file(out + "/logs/rank-0.log");
  EXPECT_NE(log0.find("checkpoints/step-4' was not saved: cannot write"), std::string::npos)
      << log0;
  EXPECT_NE(log0.find("No space left on device"), std::string::npos) << log0;
  EXPECT_TRUE(events(out, "failure").empty()) << "a full disk is not a failure to restart";
  const auto failed = events(out, "checkpoint_failed");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0]["step"], 4);
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step-4"));
  for (const char* kept : {"step-2", "step-6", "step-8"})
    EXPECT_TRUE(fs::exists(out + "/checkpoints/" + kept)) << kept;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
    EXPECT_TRUE(e.path().filename().string().starts_with("step-")) << "left behind: " << e.path();
  expect_same_final_weights(out);
}

// (b) A hung rank (it stops beating, as a deadlocked main thread would)
// while rank 0 waits for it in a collective, beating: named within the
// heartbeat timeout (plus one poll), stopped, and the job recovers.
TEST(Supervisor, AHungRankIsDetectedWithinTheHeartbeatTimeoutAndTheJobRecovers) {
  const std::string out = run_dir("hung");
  const Outcome r =
      launch_tiny(out, "--max-restarts 1 --heartbeat-timeout 5", "rank=1,step=3,kind=hang");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("a rank sent no heartbeat for 5 s (--heartbeat-timeout)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 0 (pid"), std::string::npos) << "the waiting rank was blamed";
  const auto failures = events(out, "failure");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0]["rank"], 1);
  EXPECT_EQ(failures[0]["cause"], "hung");
  EXPECT_EQ(failures[0]["last_step"], 3);
  // The marker is written just before the rank hangs.
  struct stat st {};
  ASSERT_EQ(::stat((out + "/logs/injected-0").c_str(), &st), 0);
  const double hung_at = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec;
  const double after = failures[0]["detected_at"].get<double>() - hung_at;
  EXPECT_GE(after, 5.0);
  EXPECT_LT(after, 5.0 + 2.5) << "detected " << after << " s after the rank hung";
  EXPECT_EQ(events(out, "recovered").size(), 1u);
  expect_same_final_weights(out);
}

// (c) A rank that exits without a word and one that throws: both restart.
TEST(Supervisor, ExitAndErrorKindsRestartToo) {
  const std::string out = run_dir("exit_error");
  const Outcome r =
      launch_tiny(out, "--max-restarts 2", "rank=0,step=2,kind=exit;rank=1,step=5,kind=error");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto failures = events(out, "failure");
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0]["rank"], 0);
  EXPECT_EQ(failures[0]["cause"], "exit code 1");
  EXPECT_EQ(failures[1]["rank"], 1);
  EXPECT_EQ(failures[1]["cause"], "error");
  EXPECT_NE(failures[1]["detail"].get<std::string>().find("injected failure on rank 1 at step 5"),
            std::string::npos);
  EXPECT_EQ(events(out, "restart").size(), 2u);
  EXPECT_EQ(events(out, "recovered").size(), 2u);
  EXPECT_EQ(count_of(r.err, "launch: restart "), 2u) << r.err;
  expect_same_final_weights(out);
}

// (c) More failures than restarts: launch gives up and names every failure.
// (An `error` at the persist point would not end the attempt: a checkpoint
// that cannot be written is a warning and training goes on.)
TEST(Supervisor, MoreFailuresThanRestartsGivesUpNamingEach) {
  const std::string out = run_dir("gives_up");
  const Outcome r =
      launch_tiny(out, "--max-restarts 1",
                  "rank=1,step=2,kind=kill;rank=0,step=4,kind=kill,at=persist;rank=1,step=6");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "launch hung until the timeout";
  EXPECT_NE(r.err.find("launch: giving up after attempt 2: all 1 restarts (--max-restarts) made; "
                       "failures:\n  attempt 1: rank 1: SIGKILL at step 2\n  attempt 2: rank 0: "
                       "SIGKILL at step 4"),
            std::string::npos)
      << r.err;
  // Killed while writing step 4's checkpoint: nothing half-written was published.
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step-4"));
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step-3"));
  const auto gave_up = events(out, "give_up");
  ASSERT_EQ(gave_up.size(), 1u);
  EXPECT_EQ(gave_up[0]["failures"].size(), 2u);
  EXPECT_FALSE(fs::exists(out + "/logs/injected-2")) << "the third failure was never reached";
}

// (c) --max-restarts 0 (the default): report the failure and stop, as before.
TEST(Supervisor, WithoutRestartsAFailureIsReportedAndTheJobStops) {
  const std::string out = run_dir("plain_failure");
  const Outcome r = launch_tiny(out, "", "rank=1,step=3,kind=kill");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "launch hung until the timeout";
  EXPECT_NE(r.err.find("launch: rank 1 was killed by SIGKILL (signal 9)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("launch: restart"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("giving up"), std::string::npos) << r.err;
  EXPECT_EQ(count_of(test::read_text_file(out + "/logs/rank-0.log"), "=== launch "), 1u);
  EXPECT_EQ(events(out, "failure").size(), 1u);
  EXPECT_TRUE(events(out, "restart").empty());
}

// A stand-in rank: beats like a trainer ("<step> <pid> start 1") every
// 0.1 s for 30 steps, stops (rank 0 writing stopped-for-resize) when the
// supervisor asks, and acts out `scenario` (shell lines run every step with
// R, N, D = rank, size, log directory and i = the step).
std::string stand_in(const std::string& name, const std::string& scenario) {
  const std::string path = test::tiny_corpus_root() + "/" + name + ".sh";
  std::ofstream f(path);
  f << "#!/bin/sh\n"
       "R=$OMPI_COMM_WORLD_RANK; N=$OMPI_COMM_WORLD_SIZE; D=$MOETRON_LAUNCH_LOG_DIR\n"
       "[ \"$R\" = 0 ] && echo \"$N\" >> \"$D/../sizes\"\n"
       "i=1\n"
       "while [ $i -le 20 ]; do\n"
       "  echo \"$i $$ start 1\" > \"$D/rank-$R.heartbeat.tmp\"\n"
       "  mv \"$D/rank-$R.heartbeat.tmp\" \"$D/rank-$R.heartbeat\"\n"
       "  if [ -f \"$D/stop-request\" ]; then\n"
       "    [ \"$R\" = 0 ] && echo $i > \"$D/stopped-for-resize\"\n"
       "    exit 0\n"
       "  fi\n"
    << scenario
    << "  sleep 0.1; i=$((i+1))\n"
       "done\n";
  f.close();
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

int launch_stand_in(const std::string& program, const std::string& out, int ranks, int min_ranks,
                    std::string& err) {
  LaunchOptions o;
  o.ranks = ranks;
  o.threads_per_rank = 1;
  o.max_restarts = 2;
  o.min_ranks = min_ranks;
  o.program = program;
  o.command = {"train", "--out", out};
  testing::internal::CaptureStderr();
  const int code = launch(o);
  err = testing::internal::GetCapturedStderr();
  return code;
}

// (e, end to end) -n 3 --min-ranks 2: rank 2's slot goes away (it exits 1
// and is listed in RUN/logs/unavailable), the job restarts on 2 ranks; then
// capacity returns (RUN/logs/capacity = 3), the supervisor asks for a stop,
// the ranks stop at a step and the job is relaunched on 3.
TEST(Supervisor, ElasticJobShrinksWithoutALostRankAndGrowsBack) {
  const std::string out = run_dir("elastic");
  const std::string program =
      stand_in("elastic",
               "  if [ $N = 3 ] && [ $R = 2 ] && [ $i = 3 ] && [ ! -f \"$D/../lost\" ]; then\n"
               "    touch \"$D/../lost\"; echo 2 > \"$D/unavailable\"; exit 1\n"
               "  fi\n"
               "  if [ $N = 2 ] && [ $R = 0 ] && [ $i = 4 ]; then echo 3 > \"$D/capacity\"; fi\n");
  std::string err;
  ASSERT_EQ(launch_stand_in(program, out, 3, 2, err), 0) << err;
  EXPECT_EQ(test::read_text_file(out + "/sizes"), "3\n2\n3\n");
  const auto failures = events(out, "failure");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0]["rank"], 2);
  EXPECT_EQ(failures[0]["cause"], "exit code 1");
  const auto restarts = events(out, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["ranks"], 2);
  const auto resizes = events(out, "resize");
  ASSERT_EQ(resizes.size(), 1u);
  EXPECT_EQ(resizes[0]["from"], 2);
  EXPECT_EQ(resizes[0]["to"], 3);
  EXPECT_GE(resizes[0]["step"].get<int>(), 4);
  EXPECT_NE(err.find("asked the job to stop for a resize"), std::string::npos) << err;
  EXPECT_NE(err.find("launch: resizing from 2 to 3 ranks after step"), std::string::npos) << err;
}

TEST(Supervisor, ElasticJobGivesUpBelowMinRanksSayingWhy) {
  const std::string out = run_dir("elastic_lost");
  const std::string program = stand_in("elastic_lost",
                                       "  if [ $R = 1 ] && [ $i = 2 ]; then\n"
                                       "    printf '1\\n2\\n' > \"$D/unavailable\"; exit 1\n"
                                       "  fi\n");
  std::string err;
  EXPECT_NE(launch_stand_in(program, out, 3, 2, err), 0) << err;
  EXPECT_NE(err.find("launch: giving up after attempt 1: only 1 of 3 ranks are usable "
                     "(unavailable: 1 2), fewer than --min-ranks 2"),
            std::string::npos)
      << err;
  EXPECT_EQ(test::read_text_file(out + "/sizes"), "3\n");
}

}  // namespace
}  // namespace moetron::train
