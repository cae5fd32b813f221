// Trainer's state keeping beyond the synchronous checkpoint: in-memory
// snapshots every checkpoint.snapshot_every steps (ckpt/snapshot.h), the
// asynchronous persist of checkpoint.every's checkpoints from them
// (ckpt/persist.h), and resuming from whichever of snapshot and disk
// checkpoint is newer.
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "moetron/ckpt/persist.h"
#include "moetron/ckpt/rank_files.h"
#include "moetron/ckpt/snapshot.h"
#include "moetron/core/staged_dir.h"
#include "moetron/planner/memory_model.h"
#include "moetron/train/fault_injection.h"
#include "moetron/train/launcher.h"
#include "moetron/train/resume_check.h"
#include "moetron/train/trainer.h"

namespace moetron::train {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

// A snapshot may cost this share of a step when checkpoint.snapshot_every is automatic.
constexpr double kSnapshotShare = 0.03;
// The automatic interval is decided from snapshots 3 to 5 (the median of
// each rank's worst): the first two fill fresh tmpfs pages, the third is
// the first written into a dropped step's files (ckpt/snapshot.h), as every
// later one is; one sample alone flips the decision near the line.
constexpr int kSnapshotFreshProbes = 2, kSnapshotProbes = 5;

// Snapshots may fill at most this share of the room where they live (on
// tmpfs, of the memory available once training has allocated its own).
constexpr double kSnapshotRoomShare = 0.5;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Ranks on one machine share its snapshot directory: they are told apart by this.
int64_t host_id() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return static_cast<int64_t>(XXH64(name, std::strlen(name), 0) >> 1);
}

// Bytes free for snapshots where `dir` lives; on tmpfs they are memory too.
int64_t snapshot_room(const std::string& dir, bool* tmpfs) {
  struct statfs st {};
  MOETRON_CHECK(::statfs(dir.c_str(), &st) == 0, "checkpoint.snapshot_dir '", dir,
                "': cannot read its filesystem's free space: ", std::strerror(errno));
  *tmpfs = st.f_type == TMPFS_MAGIC;
  const int64_t room = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_bsize);
  return *tmpfs ? std::min(room, planner::available_memory_bytes()) : room;
}

double gib(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 30);
}

}  // namespace

void Trainer::setup_snapshots(bool resume) {
  const CheckpointConfig& c = cfg_.checkpoint;
  if (c.snapshot_every == 0) return;
  snapshot_comm_ = world_->split(0, world_->rank());  // collective: every rank
  // One id per attempt: parts of a step written by different attempts never mix.
  uint64_t job_id = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ ::getpid();
  snapshot_comm_->broadcast(Tensor::wrap(&job_id, {1}, DType::i64), 0);
  int32_t ok = 1;
  std::string root, why;
  try {
    root = ckpt::snapshot_root(c.snapshot_dir, run_dir_);
    fs::create_directories(c.snapshot_dir);
    if (is_root()) {
      for (const auto& d : ckpt::remove_orphaned_snapshots(c.snapshot_dir))
        std::cerr << "notice: removed '" << d << "': snapshots of a deleted run directory\n";
      // A new run must never resume from snapshots an earlier run in this directory left.
      if (!resume) remove_tree(root);
    }
  } catch (const std::exception& e) {
    ok = 0;
    why = e.what();
  }
  snapshot_comm_->allreduce(Tensor::wrap(&ok, {1}, DType::i32), comm::ReduceOp::sum);
  if (ok != snapshot_comm_->size()) {
    if (is_root()) {
      std::cerr << "warning: in-memory snapshots are off: checkpoint.snapshot_dir '"
                << c.snapshot_dir << "' is not usable on every rank" << (why.empty() ? "" : ": ")
                << why << std::endl;
    }
    return;
  }
  std::vector<int64_t> hosts(static_cast<size_t>(snapshot_comm_->size()));
  int64_t mine = host_id();
  snapshot_comm_->allgather(Tensor::wrap(&mine, {1}, DType::i64),
                            Tensor::wrap(hosts.data(), {snapshot_comm_->size()}, DType::i64));
  snapshots_ = std::make_unique<ckpt::SnapshotStore>(root, *snapshot_comm_, job_id, hosts,
                                                     ckpt::parse_snapshot_copy(c.snapshot_copy));
  const int rank = world_->rank();
  snapshots_->before_write = [rank](int64_t step, const std::string& dir) {
    maybe_fail_write(rank, step, dir, FailurePoint::snapshot);
  };
  snapshots_->after_files_written = [rank](int64_t step) {
    maybe_inject_failure(rank, step, FailurePoint::snapshot);
  };
  snapshot_every_ = c.snapshot_every;  // -1: decided on the third snapshot
  if (c.async) {
    persister_ = std::make_unique<ckpt::AsyncPersister>(run_dir_, *snapshot_comm_, c.keep,
                                                        model_signature(cfg_));
    persister_->before_write = [rank](int64_t step, const std::string& path) {
      maybe_fail_write(rank, step, path, FailurePoint::persist);
    };
    persister_->after_copy = [rank](int64_t step) {
      maybe_inject_failure(rank, step, FailurePoint::persist);
    };
  }
}

ckpt::SaveRequest Trainer::checkpoint_request(int64_t step) {
  const parallel::PlanSettings& s = plan_->settings();
  ckpt::SaveRequest req;
  req.trainer_state = {
      {"step", step},
      {"samples_drawn", static_cast<uint64_t>(step * cfg_.train.micro_batch * acc_ * plan_->dp())},
      {"dp", plan_->dp()},
      {"tp", s.tp},
      {"ep", s.ep},
      {"pp", s.pp},
      {"cp", s.cp},
      {"skipped_steps", skipped_},
      {"loss_scale", scaler_.scale()},
      {"loss_scale_clean_steps", scaler_.clean_steps()},
      {"overflow_steps", scaler_.overflow_steps()},
      {"seed", cfg_.train.seed}};
  if (balancer_) req.trainer_state["multitask"] = balancer_->to_json();
  if (compression_start_) req.trainer_state["compression"] = compression_state();
  req.run_dir = run_dir_;
  req.step = step;
  req.config_toml = to_toml(cfg_);
  req.keep = cfg_.checkpoint.keep;
  req.model_signature = model_signature(cfg_);
  req.world = world_.get();
  req.extra = feedback_slices(true);
  req.writes = [this](const std::string& n) { return writes_checkpoint_tensor(n); };
  return req;
}

bool Trainer::snapshots_fit(int64_t part_bytes) {
  const int n = snapshot_comm_->size();
  int64_t mine[2] = {host_id(), part_bytes};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  snapshot_comm_->allgather(Tensor::wrap(mine, {2}, DType::i64),
                            Tensor::wrap(all.data(), {2 * n}, DType::i64));
  int64_t machine = 0;  // this machine's ranks' parts
  for (int r = 0; r < n; ++r) {
    if (all[2 * static_cast<size_t>(r)] == mine[0]) machine += all[2 * static_cast<size_t>(r) + 1];
  }
  // Two steps (the complete one and the one being written), own part and copy.
  const int64_t need = 2 * (snapshots_->keeps_copies() ? 2 : 1) * machine;
  bool tmpfs = false;
  int64_t room = 0;
  std::string why;
  try {
    room = snapshot_room(cfg_.checkpoint.snapshot_dir, &tmpfs);
  } catch (const Error& e) {
    why = e.what();
  }
  const bool fits = static_cast<double>(need) <= kSnapshotRoomShare * static_cast<double>(room);
  int32_t short_of_room = why.empty() && fits ? 0 : 1;
  snapshot_comm_->allreduce(Tensor::wrap(&short_of_room, {1}, DType::i32), comm::ReduceOp::max);
  if (short_of_room == 0) return true;
  char line[512];
  std::snprintf(line, sizeof line,
                "in-memory snapshots are off: this machine's ranks need %.2f GiB for them (two "
                "steps, own parts%s, %.2f GiB a rank here), more than %.0f%% of the %.2f GiB "
                "free in checkpoint.snapshot_dir '%s'%s",
                gib(need), n > 1 ? " and neighbours' copies" : "", gib(part_bytes),
                100 * kSnapshotRoomShare, gib(room), cfg_.checkpoint.snapshot_dir.c_str(),
                tmpfs ? " (tmpfs: memory, after training's own)" : "");
  if (!why.empty()) std::cerr << "warning: rank " << world_->rank() << ": " << why << std::endl;
  if (why.empty() && !fits)
    std::cerr << "warning: rank " << world_->rank() << ": " << line << std::endl;
  if (is_root()) {
    std::cerr << "warning: in-memory snapshots are off (see the rank warnings); checkpoints are "
                 "written synchronously"
              << std::endl;
    monitor_->event(start_step_, "snapshots_off", line,
                    {{"need_bytes", need}, {"room_bytes", room}, {"tmpfs", tmpfs}});
  }
  return false;
}

void Trainer::take_snapshot(int64_t step) {
  const ckpt::SaveRequest req = checkpoint_request(step);
  const ckpt::RankFiles files =
      ckpt::rank_files_to_write(world_->rank(), *model_, *opt_, req.writes, req.extra);
  if (!snapshot_room_checked_) {
    snapshot_room_checked_ = true;
    if (!snapshots_fit(files.tensor_bytes())) {
      // Nothing is in flight before the first snapshot; an earlier
      // attempt's snapshots would only hold the memory found missing.
      persister_.reset();
      snapshot_comm_->barrier();
      if (is_root()) remove_tree(snapshots_->root());
      snapshots_.reset();
      snapshot_every_ = 0;
      return;
    }
  }
  snapshots_->save(req, files, *model_, persister_ ? persister_->in_flight() : -1);
  last_snapshot_ = step;
}

// Automatic interval: every step unless a snapshot costs more than
// kSnapshotShare of a step. Decided once, from the slowest rank's numbers,
// so every rank takes the same (collective) snapshots.
void Trainer::probe_snapshot_cost(double snapshot_s, double step_s) {
  if (++snapshot_probes_ <= kSnapshotFreshProbes) return;
  const ckpt::SnapshotStore::Timing& t = snapshots_->last_timing();
  std::array<double, 5> worst = {snapshot_s, step_s, t.write_s, t.exchange_s, t.agree_s};
  snapshot_comm_->allreduce(Tensor::wrap(worst.data(), {5}, DType::f64), comm::ReduceOp::max);
  snapshot_samples_.push_back(worst);
  if (snapshot_probes_ < kSnapshotProbes) return;
  // The sample of the median snapshot time (the same on every rank).
  std::sort(snapshot_samples_.begin(), snapshot_samples_.end());
  worst = snapshot_samples_[snapshot_samples_.size() / 2];
  snapshot_every_ =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(worst[0] / (kSnapshotShare * worst[1]))));
  if (is_root()) {
    std::cerr << "snapshots every " << snapshot_every_ << " step(s): one takes " << worst[0] * 1e3
              << " ms (slowest rank: write " << worst[2] * 1e3 << " ms, neighbour copy "
              << worst[3] * 1e3 << " ms, agree " << worst[4] * 1e3 << " ms; median of "
              << snapshot_samples_.size() << " after the first " << kSnapshotFreshProbes
              << "; rank 0 wrote " << static_cast<double>(t.bytes) / (1 << 20) << " MiB), a step "
              << worst[1] * 1e3 << " ms" << std::endl;
  }
}

void Trainer::keep_state(int64_t step, StepRecord& rec) {
  const bool persist_now = cfg_.checkpoint.every > 0 && step % cfg_.checkpoint.every == 0 &&
                           step != cfg_.train.steps && guard_.stop_reason().empty();
  // A step whose update was skipped (or a diverging run) is no state to keep.
  const bool keepable = guard_.stop_reason().empty() && guard_.consecutive_skips() == 0;
  if (snapshots_ && keepable && step != cfg_.train.steps) {
    const bool probing = snapshot_every_ < 0 && step > start_step_ + 1;  // step 1 warms up
    const bool due = probing || (snapshot_every_ > 0 && step % snapshot_every_ == 0);
    if (due || (persist_now && persister_)) {
      const auto t0 = clock_type::now();
      take_snapshot(step);
      if (snapshots_) {  // (not turned off for want of room)
        rec.snapshot_s = seconds_since(t0);
        if (monitor_->enabled() && is_root()) monitor_->metrics().record_snapshot(rec.snapshot_s);
        if (probing) probe_snapshot_cost(rec.snapshot_s, rec.step_s);
      }
    }
  }
  if (!persist_now) return;
  const auto t0 = clock_type::now();
  if (persister_ && last_snapshot_ == step) {
    persister_->start(step, snapshots_->part_dir(step),
                      ckpt::layout_of(checkpoint_request(step).trainer_state));
  } else {
    save_periodic_checkpoint(step);
  }
  rec.checkpoint_s = seconds_since(t0);
}

void Trainer::report_persist(bool wait) {
  if (!persister_) return;
  if (wait) persister_->wait();
  const auto out = persister_->take_outcome();
  if (!out) return;
  const std::string dir = ckpt::checkpoint_dir(run_dir_, out->step);
  if (!out->error.empty()) {
    // A full disk must not stop training: the previous checkpoint stays the newest.
    std::cerr << "warning: rank " << world_->rank() << ": checkpoint '" << dir
              << "' was not saved: " << out->error << "; the previous checkpoint is kept"
              << std::endl;
    if (monitor_->enabled() && is_root()) {
      monitor_->metrics().record_persist_failure();
      monitor_->event(out->step, "checkpoint_failed", "not saved " + dir + ": " + out->error,
                      {{"path", dir}, {"error", out->error}});
    }
    return;
  }
  if (!out->published || !monitor_->enabled()) return;
  monitor_->metrics().record_checkpoint_save(out->seconds, out->bytes);
  monitor_->event(out->step, "checkpoint", "saved " + dir + " (in the background)",
                  {{"path", dir}, {"seconds", out->seconds}, {"bytes", out->bytes}});
}

void Trainer::finish_snapshots() {
  report_persist(true);
  if (!snapshots_) return;
  // The final checkpoint is on disk: the snapshots have served.
  snapshot_comm_->barrier();
  if (is_root()) remove_tree(snapshots_->root());
}

// Rank 0: the newest complete snapshot, assembled into a checkpoint
// directory, when it is newer than the newest disk checkpoint `disk_step`.
std::optional<std::string> Trainer::newer_snapshot(int64_t disk_step) {
  if (!snapshots_) return std::nullopt;
  std::vector<std::string> warnings;
  const auto set = ckpt::latest_snapshot(snapshots_->root(), &warnings);
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  if (!set || set->step <= disk_step) return std::nullopt;
  const std::string dir = snapshots_->root() + "/assembled/step-" + std::to_string(set->step);
  ckpt::assemble_snapshot(*set, dir);
  return dir;
}

void Trainer::record_recovery() const {
  const char* restarts = std::getenv(kRestartsEnv);
  if (!restarts || !monitor_->enabled() || !is_root()) return;
  const char* at = std::getenv(kFailureDetectedAtEnv);
  const double detected = at ? std::strtod(at, nullptr) : 0;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  monitor_->metrics().record_recovery(std::strtoll(restarts, nullptr, 10),
                                      detected > 0 ? now - detected : -1);
}

bool Trainer::launcher_asks_to_stop() const {
  const char* logs = std::getenv(kLaunchLogDirEnv);
  return logs != nullptr && *logs != 0 &&
         ::access((std::string(logs) + "/stop-request").c_str(), F_OK) == 0;
}

void Trainer::stop_for_resize(int64_t step) {
  if (snapshots_) {
    if (last_snapshot_ != step) take_snapshot(step);
  } else {
    save_checkpoint(step);
  }
  report_persist(true);
  monitor_->event(
      step, "stop",
      "stopped at step " + std::to_string(step) + " for a resize asked by the launcher");
  world_->barrier();  // every rank's state is kept before the launcher hears of it
  const char* logs = std::getenv(kLaunchLogDirEnv);
  if (is_root() && logs != nullptr) {
    std::ofstream(std::string(logs) + "/stopped-for-resize") << step << "\n";
    std::cerr << "stopped at step " << step << " for a resize (the launcher asked)" << std::endl;
  }
}

}  // namespace moetron::train
