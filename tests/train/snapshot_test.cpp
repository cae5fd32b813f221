// In-memory snapshots and asynchronous checkpoints on one rank: a crash
// resumes from the newest snapshot bit-identically, a damaged snapshot falls
// back to the disk checkpoint, a persist that fails warns and training goes
// on, and a persisted checkpoint holds what a synchronous save writes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/ckpt/snapshot.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/trainer.h"
#include "util/tiny_corpus.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const std::string d = test::tiny_corpus_root() + "/snapshot_test/" + name;
  remove_tree(d);
  return d;
}

// The snapshots of these runs live beside them, not in /dev/shm.
std::string shm_base() {
  return test::tiny_corpus_root() + "/snapshot_test/shm";
}

Config config(int64_t steps, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"train.steps=" + std::to_string(steps), "train.eval_batches=1",
                                   "checkpoint.snapshot_dir=" + shm_base()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::tiny_train_config(sets);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Trains `steps`; the run stops with an error at step `crash` (before its
// update) when crash > 0, as a killed process would, leaving its snapshots.
void train(const std::string& dir, Config cfg, bool resume, int64_t crash = 0) {
  Trainer t(std::move(cfg), dir, resume);
  if (crash > 0) {
    t.before_update = [crash](int64_t step) {
      if (step == crash) MOETRON_FAIL("simulated crash at step ", step);
    };
    EXPECT_THROW(t.run(), Error);
    return;
  }
  t.run();
}

// Final weights and optimizer state, byte for byte.
void expect_same_final_state(const std::string& a, const std::string& b, int64_t step) {
  for (const char* f : {"model.safetensors", "optimizer-rank-0.safetensors", "state.safetensors"}) {
    const std::string pa = ckpt::checkpoint_dir(a, step) + "/" + f;
    const std::string pb = ckpt::checkpoint_dir(b, step) + "/" + f;
    ASSERT_TRUE(fs::exists(pa)) << pa;
    ASSERT_TRUE(fs::exists(pb)) << pb;
    EXPECT_TRUE(slurp(pa) == slurp(pb)) << f << " differs between " << a << " and " << b;
  }
}

std::string resume_source(const std::string& dir) {
  std::ifstream f(dir + "/events.jsonl");
  std::string line, source;
  while (std::getline(f, line)) {
    const auto e = nlohmann::json::parse(line);
    if (e.value("kind", "") == "resume") source = e.value("source", "") + " " + e.value("path", "");
  }
  return source;
}

const std::string& reference_run() {  // 6 steps, no snapshots
  static const std::string dir = [] {
    const std::string d = scratch("reference");
    train(d, config(6, {"checkpoint.snapshot_every=0"}), false);
    return d;
  }();
  return dir;
}

TEST(Snapshots, ACrashResumesFromTheNewestSnapshotBitIdentically) {
  const std::string dir = scratch("crash");
  const Config cfg = config(6, {"checkpoint.snapshot_every=1"});
  train(dir, cfg, false, /*crash=*/5);
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step-4")) << "no disk checkpoint was asked for";
  train(dir, cfg, true);
  EXPECT_NE(resume_source(dir).find("snapshot"), std::string::npos) << resume_source(dir);
  EXPECT_NE(resume_source(dir).find("step-4"), std::string::npos) << resume_source(dir);
  expect_same_final_state(reference_run(), dir, 6);
  // A finished run leaves nothing in memory.
  EXPECT_FALSE(fs::exists(ckpt::snapshot_root(shm_base(), dir) + "/rank-0"));
}

// A snapshot after the second writes into the files of the step it dropped
// (in place: tmpfs keeps their pages), and resuming from one is still exact
// (ACrashResumesFromTheNewestSnapshotBitIdentically resumes a recycled step 4).
TEST(Snapshots, EachSnapshotAfterTheSecondRecyclesTheDroppedStepsFiles) {
  const std::string dir = scratch("recycle");
  Trainer t(config(6, {"checkpoint.snapshot_every=1"}), dir, false);
  const std::string root = ckpt::snapshot_root(shm_base(), dir);
  std::vector<ino_t> inodes;  // of each snapshot's model file, steps 1..4
  t.before_update = [&](int64_t step) {
    if (step < 2 || step > 5) return;
    struct stat st {};
    const std::string file =
        root + "/rank-0/step-" + std::to_string(step - 1) + "/model.safetensors";
    ASSERT_EQ(::stat(file.c_str(), &st), 0) << file;
    inodes.push_back(st.st_ino);
  };
  t.run();
  ASSERT_EQ(inodes.size(), 4u);
  EXPECT_NE(inodes[0], inodes[1]);
  EXPECT_EQ(inodes[2], inodes[0]) << "step 3 should reuse step 1's file";
  EXPECT_EQ(inodes[3], inodes[1]) << "step 4 should reuse step 2's file";
}

TEST(Snapshots, ADamagedSnapshotIsSkippedForTheDiskCheckpoint) {
  const std::string dir = scratch("damaged");
  const Config cfg = config(6, {"checkpoint.snapshot_every=1", "checkpoint.every=2"});
  train(dir, cfg, false, /*crash=*/6);  // snapshots of steps 4 and 5; step-4 persisted
  const std::string part = ckpt::snapshot_root(shm_base(), dir) + "/rank-0/step-5";
  ASSERT_TRUE(fs::exists(part + "/optimizer-rank-0.safetensors"));
  {
    std::fstream f(part + "/optimizer-rank-0.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  // Step 5's part fails its checksum, so the newest usable state is step 4:
  // on disk (persisted in the background) and in the second buffer alike.
  train(dir, cfg, true);
  EXPECT_NE(resume_source(dir).find("checkpoint"), std::string::npos) << resume_source(dir);
  EXPECT_NE(resume_source(dir).find("checkpoints/step-4"), std::string::npos) << resume_source(dir);
  expect_same_final_state(reference_run(), dir, 6);
}

TEST(Snapshots, APartialSnapshotIsNeverResumed) {
  const std::string dir = scratch("partial");
  const Config cfg = config(6, {"checkpoint.snapshot_every=1"});
  train(dir, cfg, false, /*crash=*/5);
  // What a kill during the copy of step 5 leaves: files without a manifest.
  const std::string root = ckpt::snapshot_root(shm_base(), dir);
  fs::create_directories(root + "/rank-0/step-5.tmp");
  std::ofstream(root + "/rank-0/step-5.tmp/model.safetensors") << "half";
  fs::create_directories(root + "/rank-0/step-5");
  std::ofstream(root + "/rank-0/step-5/model.safetensors") << "half";
  std::vector<std::string> warnings;
  const auto set = ckpt::latest_snapshot(root, &warnings);
  ASSERT_TRUE(set.has_value());
  EXPECT_EQ(set->step, 4);
  train(dir, cfg, true);
  expect_same_final_state(reference_run(), dir, 6);
}

TEST(Snapshots, APersistThatFailsWarnsAndTrainingGoesOn) {
  const std::string dir = scratch("persist_fails");
  Trainer t(config(4, {"checkpoint.snapshot_every=1", "checkpoint.every=2"}), dir, false);
  // Something already holds step-2's name: its persist cannot publish.
  t.before_update = [&](int64_t step) {
    if (step == 2) std::ofstream(dir + "/checkpoints/step-2") << "in the way";
  };
  fs::create_directories(dir + "/checkpoints");
  testing::internal::CaptureStderr();
  const TrainResult r = t.run();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.steps_done, 4);
  EXPECT_NE(err.find("checkpoint '" + ckpt::checkpoint_dir(dir, 2) + "' was not saved"),
            std::string::npos)
      << err;
  EXPECT_TRUE(fs::is_directory(ckpt::checkpoint_dir(dir, 4)));
  EXPECT_NE(slurp(dir + "/events.jsonl").find("checkpoint_failed"), std::string::npos);
}

TEST(Snapshots, APersistedCheckpointHoldsWhatASynchronousSaveWrites) {
  const std::string sync = scratch("sync"), async = scratch("async");
  train(sync, config(4, {"checkpoint.snapshot_every=0", "checkpoint.every=2"}), false);
  train(async, config(4, {"checkpoint.snapshot_every=1", "checkpoint.every=2"}), false);
  const auto a = verify_manifest(ckpt::checkpoint_dir(sync, 2));
  const auto b = verify_manifest(ckpt::checkpoint_dir(async, 2));
  EXPECT_EQ(a, b);  // step, ranks, model files, layout, model signature
  for (const char* f : {"model.safetensors", "optimizer-rank-0.safetensors", "state.safetensors",
                        "trainer.json", "config.json"}) {
    EXPECT_TRUE(slurp(ckpt::checkpoint_dir(sync, 2) + "/" + f) ==
                slurp(ckpt::checkpoint_dir(async, 2) + "/" + f))
        << f;
  }
}

TEST(Snapshots, TheAutomaticIntervalIsDecidedAndAnnounced) {
  const std::string dir = scratch("auto");
  testing::internal::CaptureStderr();
  // Snapshots after steps 2 to 6; the median of the last three decides.
  train(dir, config(8, {"checkpoint.snapshot_every=-1"}), false);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("snapshots every "), std::string::npos) << err;
}

TEST(Snapshots, ANewRunNeverResumesAnEarlierRunsSnapshots) {
  const std::string dir = scratch("stale");
  const Config cfg = config(6, {"checkpoint.snapshot_every=1"});
  train(dir, cfg, false, /*crash=*/5);
  remove_tree(dir);  // the run is thrown away; its snapshots are still in memory
  train(dir, config(2, {"checkpoint.snapshot_every=1"}), false);
  train(dir, config(3, {"checkpoint.snapshot_every=1"}), true);
  EXPECT_NE(resume_source(dir).find("checkpoints/step-2"), std::string::npos) << resume_source(dir);
}

// Snapshots that would not fit where they live are turned off before the
// first is written, saying how much they need and how much there is; the
// run goes on and its checkpoints are written synchronously. The small
// filesystem is a real 256 KiB tmpfs (mounting it needs root; skipped
// otherwise), smaller than twice the tiny model's part.
TEST(Snapshots, SnapshotsThatDoNotFitAreTurnedOffAndTrainingGoesOn) {
  const std::string dir = scratch("no_room"), small = scratch("small_tmpfs");
  fs::create_directories(small);
  if (std::system(("mount -t tmpfs -o size=256k tmpfs " + small + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): the room check is not exercised";
  Config cfg = config(4, {"checkpoint.snapshot_every=1", "checkpoint.every=2"});
  cfg.checkpoint.snapshot_dir = small;
  testing::internal::CaptureStderr();
  TrainResult r;
  {
    Trainer t(cfg, dir, false);
    r = t.run();
  }
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string left = fs::exists(small) ? std::to_string(directory_bytes(small)) : "?";
  std::system(("umount " + small).c_str());
  EXPECT_EQ(r.steps_done, 4);
  EXPECT_NE(err.find("in-memory snapshots are off: this machine's ranks need"), std::string::npos)
      << err;
  EXPECT_NE(err.find("checkpoint.snapshot_dir '" + small + "' (tmpfs"), std::string::npos) << err;
  EXPECT_NE(slurp(dir + "/events.jsonl").find("\"snapshots_off\""), std::string::npos);
  EXPECT_TRUE(fs::is_directory(ckpt::checkpoint_dir(dir, 2)));  // written synchronously
  EXPECT_TRUE(fs::is_directory(ckpt::checkpoint_dir(dir, 4)));
  EXPECT_EQ(left, "0") << "nothing was written into the small tmpfs";
}

}  // namespace
}  // namespace moetron::train
