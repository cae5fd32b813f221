// In-memory snapshots of the training state: every rank writes its part of a
// checkpoint (ckpt/rank_files.h: the same files, so a snapshot loads and
// reshards like one) into a directory on tmpfs (/dev/shm), which outlives
// the process; a crashed job resumes from it without touching the disk.
//   ROOT/rank-R/step-N/            rank R's files + manifest.json (checksums)
//   ROOT/rank-R/copy-of-Q/step-N/  a copy of rank Q = R-s's part (s: see
//                                  copy_shift), sent over
//                                  the snapshot communicator in bounded
//                                  chunks (ckpt/dir_exchange.h), so losing
//                                  one rank's memory still leaves every part
// A part is written under step-N.tmp and renamed when complete. The dropped
// step's directory is kept as `spare` and the next part is written into it,
// over its files (core/overwrite_file.h): tmpfs keeps the pages, so a
// snapshot after the first copies bytes without faulting in fresh pages. A step's
// parts are dropped once every rank has finished the next one (they agree
// first), so some step is always complete on every rank and a rank holds at
// most two steps (one as the spare), own part and copy: 4x its part (the trainer
// checks that fits before the first snapshot). A snapshot is usable only
// when every rank of the job that wrote it has a part (its own or the copy)
// that verifies.
//
// Single machine: recovery reads every rank's part from one ROOT. On several
// machines each node's tmpfs holds its own ranks' parts; gathering them over
// the network for recovery is not built (the disk checkpoints still are).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "moetron/ckpt/rank_files.h"
#include "moetron/comm/communicator.h"

namespace moetron::ckpt {

// ROOT of a run: <base>/<16 hex digits of the hash of the run directory's
// absolute path>; ROOT/run_dir (written with the first snapshot) names the run.
std::string snapshot_root(const std::string& base, const std::string& run_dir);

// Removes the roots under `base` whose run directory no longer exists (a
// deleted run's snapshots only hold memory); returns them.
std::vector<std::string> remove_orphaned_snapshots(const std::string& base);

// Where the neighbour copies go (CheckpointConfig::snapshot_copy).
enum class SnapshotCopy { other_host, always, off };
SnapshotCopy parse_snapshot_copy(const std::string& name);

// The ring shift s of the neighbour copies (rank r sends its part to rank
// r + s mod n): "always" 1; "other_host" the smallest s that puts every
// rank's copy on another machine than its original (hosts: each rank's
// machine), 0 when none does (one machine); "off" 0. A shift is a
// permutation, so every rank sends one part and keeps one copy.
int copy_shift(const std::vector<int64_t>& hosts, SnapshotCopy policy);

class SnapshotStore {
 public:
  // comm: every rank of the job, on a communicator of its own (its traffic
  // counts as the snapshots'). job_id: the same on every rank of this
  // attempt (parts of one step from different attempts never mix).
  // hosts: each rank's machine (an id); with `copy`, where the copies go.
  SnapshotStore(std::string root, comm::Communicator& comm, uint64_t job_id,
                const std::vector<int64_t>& hosts, SnapshotCopy copy);

  // Collective. Writes this rank's part of req.step, sends it to the rank
  // that keeps its copy (copy_shift), agrees that every rank succeeded, then drops this rank's
  // older parts (never step `pinned`, being persisted). A failure on any rank throws on every rank;
  // the previous snapshot stays.
  void save(const SaveRequest& req, const RankFiles& files, nn::Transformer& model,
            int64_t pinned = -1);
  // This rank's part of step N (what the persister copies to disk).
  std::string part_dir(int64_t step) const;
  const std::string& root() const { return root_; }
  bool keeps_copies() const { return shift_ > 0; }
  // Where the last save's time went on this rank: writing its part (files
  // and checksums), the neighbour exchange (send + write the copy), and the
  // agreement and pruning (which waits for the slowest rank).
  struct Timing {
    double write_s = 0, exchange_s = 0, agree_s = 0;
    int64_t bytes = 0;  // written: own part + the copy received
  };
  const Timing& last_timing() const { return timing_; }
  // Test and fault hooks: after this rank's files are written, before its
  // manifest and rename (a crash there must leave the previous snapshot).
  std::function<void(int64_t step)> after_files_written;
  // Before anything is written (a disk-full check).
  std::function<void(int64_t step, const std::string& dir)> before_write;

 private:
  std::string write_own_part(const SaveRequest& req, const RankFiles& files,
                             nn::Transformer& model);
  void exchange_with_neighbours(int64_t step, const std::string& own);
  void prune(int64_t pinned);

  std::string root_;
  comm::Communicator& comm_;
  uint64_t job_id_;
  int shift_ = 0;               // of the neighbour copies; 0: none
  std::vector<int64_t> steps_;  // this rank's parts, oldest first
  Timing timing_;
};

// The parts of one complete snapshot, by rank.
struct SnapshotSet {
  int64_t step = 0;
  int ranks = 0;
  std::vector<std::string> part_dirs;
};

// The newest step whose parts exist and verify for every rank of the job that
// wrote it (each rank's own part, else its neighbour's copy). Every damaged
// or missing part it passes over adds a warning naming it.
std::optional<SnapshotSet> latest_snapshot(const std::string& root,
                                           std::vector<std::string>* warnings);

// Makes `dir` (replaced if it exists) a checkpoint directory holding every
// part's files (hard links, copies across filesystems) and one manifest.
void assemble_snapshot(const SnapshotSet& set, const std::string& dir);

}  // namespace moetron::ckpt
