#include "moetron/ckpt/persist.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/ckpt/rank_files.h"
#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"

namespace moetron::ckpt {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

std::string marker(const std::string& staging, const char* kind, int rank) {
  return staging + "/." + kind + "-rank-" + std::to_string(rank);
}

}  // namespace

AsyncPersister::AsyncPersister(std::string run_dir, comm::Communicator& comm, int64_t keep,
                               std::string model_signature, double marker_timeout_s)
    : run_dir_(std::move(run_dir)),
      comm_(comm),
      keep_(keep),
      signature_(std::move(model_signature)),
      marker_timeout_s_(marker_timeout_s) {}

AsyncPersister::~AsyncPersister() {
  // A persist still waiting for another rank's marker would wait for a
  // rank that is gone: give up on it (nothing is published).
  cancel_ = true;
  if (thread_.joinable()) thread_.join();
}

void AsyncPersister::wait() {
  if (thread_.joinable()) thread_.join();
}

std::optional<PersistOutcome> AsyncPersister::take_outcome() {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<PersistOutcome> out;
  out.swap(outcome_);
  return out;
}

void AsyncPersister::start(int64_t step, const std::string& part_dir,
                           const nlohmann::json& layout) {
  wait();
  std::unique_ptr<StagedDir> staged;
  std::string staging, error;
  if (comm_.rank() == 0) {
    try {
      staged = std::make_unique<StagedDir>(checkpoint_dir(run_dir_, step));
      staging = staged->staging_path();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (comm_.size() > 1) comm::broadcast_string(comm_, staging);  // empty: rank 0 could not stage
  if (staging.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    outcome_ = PersistOutcome{step, false,
                              error.empty() ? "rank 0 could not stage the checkpoint" : error};
    return;
  }
  in_flight_ = step;
  thread_ = std::thread([this, step, part_dir, staging, layout,
                         staged = std::shared_ptr<StagedDir>(std::move(staged))] {
    const auto t0 = clock_type::now();
    PersistOutcome out{step, false, ""};
    try {
      copy_part(step, part_dir, staging);
      if (comm_.rank() == 0) {
        out = publish(step, staging, layout);
        staged->commit();
        prune_checkpoints(run_dir_, keep_, signature_);
        out.published = true;
        out.bytes = directory_bytes(checkpoint_dir(run_dir_, step));
      }
    } catch (const std::exception& e) {
      out.error = e.what();
      if (comm_.rank() != 0) std::ofstream(marker(staging, "failed", comm_.rank())) << e.what();
    }
    out.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    in_flight_ = -1;
    std::lock_guard<std::mutex> lock(mu_);
    outcome_ = out;
  });
}

void AsyncPersister::copy_part(int64_t step, const std::string& part_dir,
                               const std::string& staging) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& e : fs::directory_iterator(part_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == kManifestName) continue;
    const std::string to = staging + "/" + name;
    if (before_write) before_write(step, to);
    fs::copy_file(e.path(), to, fs::copy_options::overwrite_existing);
    fsync_path(to);
    names.push_back(name);
  }
  if (after_copy) after_copy(step);
  std::ofstream done(marker(staging, "done", comm_.rank()));
  done << names.dump() << "\n";
  done.flush();
  MOETRON_CHECK(done.good(), "cannot write '", marker(staging, "done", comm_.rank()), "'");
}

// Rank 0's thread: every rank's marker, then the manifest over all files.
PersistOutcome AsyncPersister::publish(int64_t step, const std::string& staging,
                                       const nlohmann::json& layout) {
  const auto t0 = clock_type::now();
  std::vector<std::string> files, model_files;
  for (int r = 0; r < comm_.size(); ++r) {
    const std::string done = marker(staging, "done", r), failed = marker(staging, "failed", r);
    while (!fs::exists(done)) {
      if (fs::exists(failed)) {
        std::ifstream f(failed);
        std::string why((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        MOETRON_FAIL("rank ", r, ": ", why);
      }
      MOETRON_CHECK(!cancel_, "the job is stopping");
      MOETRON_CHECK(
          std::chrono::duration<double>(clock_type::now() - t0).count() < marker_timeout_s_,
          "rank ", r, " did not finish its part within ", marker_timeout_s_, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream f(done);
    for (const auto& n : nlohmann::json::parse(f)) {
      files.push_back(n.get<std::string>());
      if (files.back() == model_file(r)) model_files.push_back(files.back());
    }
    fs::remove(done);
  }
  write_manifest(staging, files,
                 checkpoint_manifest_state(step, comm_.size(), model_files, layout, signature_));
  return PersistOutcome{step, false, ""};
}

}  // namespace moetron::ckpt
