// Asynchronous persistent checkpoints: a snapshot's parts (ckpt/snapshot.h)
// copied to RUN_DIR/checkpoints/step-N by a background thread on every rank,
// so a training step waits only for the in-memory snapshot. The directory is
// published as save_checkpoint publishes one (staged, fsync'd, renamed, with a
// manifest of checksums; ckpt/checkpoint.h), so it loads the same way.
//
// The threads never call the communicator: rank 0 stages the directory and
// broadcasts its path when a persist starts (on the main thread); each
// rank's thread then copies its part and leaves a marker (.done-rank-R, or
// .failed-rank-R with the error) in the staging directory; rank 0's thread
// waits for every marker, writes the manifest, commits and prunes. A failure
// anywhere (a full disk) abandons that checkpoint: the previous one stays
// the newest, training goes on, and outcome() says why.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "moetron/comm/communicator.h"

namespace moetron::ckpt {

struct PersistOutcome {
  int64_t step = -1;
  bool published = false;  // rank 0: the checkpoint is on disk
  std::string error;       // why not (this rank's failure, or rank 0: any rank's)
  double seconds = 0;      // from start to publication (or failure)
  int64_t bytes = 0;       // of the published directory (rank 0)
};

class AsyncPersister {
 public:
  // keep / model_signature: pruning as SaveRequest's. Markers are waited
  // for at most marker_timeout_s (a rank that died never leaves one).
  AsyncPersister(std::string run_dir, comm::Communicator& comm, int64_t keep,
                 std::string model_signature, double marker_timeout_s = 600);
  ~AsyncPersister();  // waits for the copy in flight
  AsyncPersister(const AsyncPersister&) = delete;
  AsyncPersister& operator=(const AsyncPersister&) = delete;

  // Collective. Waits for the previous persist, then starts copying this
  // rank's part of `step` (part_dir: its snapshot part) in the background.
  // `layout`: dp/tp/ep/pp recorded in the manifest.
  void start(int64_t step, const std::string& part_dir, const nlohmann::json& layout);
  // Blocks until the persist in flight (if any) has finished.
  void wait();
  // The step being copied (-1: none): its snapshot part must not be pruned.
  int64_t in_flight() const { return in_flight_.load(); }
  // The outcome of a finished persist not yet taken (nullopt: none, or still running).
  std::optional<PersistOutcome> take_outcome();

  // Fault hooks, called on the background thread: before a file is written
  // (a disk-full check) and after this rank's files are copied (a crash there
  // must leave no published directory).
  std::function<void(int64_t step, const std::string& path)> before_write;
  std::function<void(int64_t step)> after_copy;

 private:
  void run(int64_t step, std::string part_dir, std::string staging, nlohmann::json layout);
  void copy_part(int64_t step, const std::string& part_dir, const std::string& staging);
  PersistOutcome publish(int64_t step, const std::string& staging, const nlohmann::json& layout);

  std::string run_dir_;
  comm::Communicator& comm_;
  int64_t keep_;
  std::string signature_;
  double marker_timeout_s_;
  std::thread thread_;
  std::atomic<int64_t> in_flight_{-1};
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::optional<PersistOutcome> outcome_;
};

}  // namespace moetron::ckpt
