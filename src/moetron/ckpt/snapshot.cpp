#include "moetron/ckpt/snapshot.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "moetron/ckpt/dir_exchange.h"
#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"

namespace moetron::ckpt {

namespace fs = std::filesystem;

namespace {

std::string hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

// N of a "step-N" name, or -1 (a .tmp or anything else).
int64_t step_of_name(const std::string& name) {
  if (!name.starts_with("step-") || name.size() == 5) return -1;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

// Reads a part's manifest state without verifying its files (nullopt: unreadable).
std::optional<nlohmann::json> part_state(const std::string& dir) {
  try {
    std::ifstream f(dir + "/" + kManifestName);
    if (!f.good()) return std::nullopt;
    nlohmann::json m = nlohmann::json::parse(f);
    nlohmann::json st = m.at("state");
    if (!st.value("snapshot_part", false)) return std::nullopt;
    return st;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The directory a dropped step leaves for the next write to recycle (its
// files are overwritten in place, keeping their tmpfs pages).
constexpr const char* kSpare = "spare";

// Makes `tmp` the empty-or-recycled directory a part is written into: the
// spare beside it when there is one, else a new directory.
void stage_into(const std::string& tmp) {
  remove_tree(tmp);
  const fs::path spare = fs::path(tmp).parent_path() / kSpare;
  std::error_code ec;
  if (fs::is_directory(spare, ec)) {
    fs::rename(spare, tmp, ec);
    if (!ec) return;
    remove_tree(spare.string());
  }
  fs::create_directories(tmp);
}

// Removes what a recycled directory holds beyond `keep` (the files just written).
void remove_other_files(const std::string& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), name) == keep.end()) remove_tree(e.path().string());
  }
}

// Drops a step's directory, keeping it as the spare when there is none yet.
void drop_step(const fs::path& dir) {
  const fs::path spare = dir.parent_path() / kSpare;
  std::error_code ec;
  if (!fs::exists(spare, ec)) {
    fs::rename(dir, spare, ec);
    if (!ec) return;
  }
  remove_tree(dir.string());
}

// Publishes a finished directory under its final name (replacing a stale one).
void rename_into_place(const std::string& tmp, const std::string& dir) {
  remove_tree(dir);
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  MOETRON_CHECK(!ec, "snapshot: cannot rename '", tmp, "' to '", dir, "': ", ec.message());
}

void agree(comm::Communicator& comm, const std::string& error, int64_t step) {
  Tensor flag = Tensor::empty({1}, DType::i32, MemTag::comm);
  flag.data<int32_t>()[0] = error.empty() ? -1 : comm.rank();
  if (comm.size() > 1) comm.allreduce(flag, comm::ReduceOp::max);
  if (!error.empty()) MOETRON_FAIL(error);
  MOETRON_CHECK(flag.data<int32_t>()[0] < 0, "snapshot of step ", step, " failed on rank ",
                flag.data<int32_t>()[0]);
}

}  // namespace

std::string snapshot_root(const std::string& base, const std::string& run_dir) {
  const std::string abs = fs::weakly_canonical(fs::absolute(run_dir)).string();
  return base + "/" + hex64(XXH64(abs.data(), abs.size(), 0));
}

std::vector<std::string> remove_orphaned_snapshots(const std::string& base) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    std::ifstream f(e.path() / "run_dir");
    std::string run_dir;
    if (!std::getline(f, run_dir) || run_dir.empty() || fs::exists(run_dir)) continue;
    remove_tree(e.path().string());
    removed.push_back(e.path().string());
  }
  return removed;
}

SnapshotCopy parse_snapshot_copy(const std::string& name) {
  if (name == "other_host") return SnapshotCopy::other_host;
  if (name == "always") return SnapshotCopy::always;
  MOETRON_CHECK(name == "off",
                "checkpoint.snapshot_copy: must be other_host, always or off, got \"", name, "\"");
  return SnapshotCopy::off;
}

int copy_shift(const std::vector<int64_t>& hosts, SnapshotCopy policy) {
  const int n = static_cast<int>(hosts.size());
  if (n < 2 || policy == SnapshotCopy::off) return 0;
  if (policy == SnapshotCopy::always) return 1;
  for (int s = 1; s < n; ++s) {
    bool apart = true;
    for (int r = 0; r < n && apart; ++r) apart = hosts[r] != hosts[(r + s) % n];
    if (apart) return s;
  }
  return 0;
}

SnapshotStore::SnapshotStore(std::string root, comm::Communicator& comm, uint64_t job_id,
                             const std::vector<int64_t>& hosts, SnapshotCopy copy)
    : root_(std::move(root)), comm_(comm), job_id_(job_id) {
  MOETRON_CHECK(static_cast<int>(hosts.size()) == comm_.size(), "snapshots: ", hosts.size(),
                " host ids for ", comm_.size(), " ranks");
  shift_ = copy_shift(hosts, copy);
}

std::string SnapshotStore::part_dir(int64_t step) const {
  return root_ + "/rank-" + std::to_string(comm_.rank()) + "/step-" + std::to_string(step);
}

std::string SnapshotStore::write_own_part(const SaveRequest& req, const RankFiles& files,
                                          nn::Transformer& model) {
  const std::string dir = part_dir(req.step), tmp = dir + ".tmp";
  if (!fs::exists(root_ + "/run_dir") && comm_.rank() == 0) {
    // Names the run, so a root whose run directory is gone can be collected.
    fs::create_directories(root_);
    std::ofstream(root_ + "/run_dir")
        << fs::weakly_canonical(fs::absolute(req.run_dir)).string() << "\n";
  }
  stage_into(tmp);
  if (before_write) before_write(req.step, tmp);
  const WrittenFiles written = write_rank_files(tmp, files, model, req);
  std::vector<std::string> keep = written.names;
  keep.push_back(kManifestName);
  remove_other_files(tmp, keep);
  if (after_files_written) after_files_written(req.step);
  write_manifest(tmp, written.names,
                 {{"snapshot_part", true},
                  {"step", req.step},
                  {"rank", comm_.rank()},
                  {"ranks", comm_.size()},
                  {"job_id", hex64(job_id_)},
                  {"layout", layout_of(req.trainer_state)},
                  {"model_signature", req.model_signature}},
                 written.checksums);
  rename_into_place(tmp, dir);
  return dir;
}

void SnapshotStore::exchange_with_neighbours(int64_t step, const std::string& own) {
  const int n = comm_.size(), next = (comm_.rank() + shift_) % n,
            prev = (comm_.rank() + n - shift_) % n;
  const std::string dir = root_ + "/rank-" + std::to_string(comm_.rank()) + "/copy-of-" +
                          std::to_string(prev) + "/step-" + std::to_string(step);
  const std::string tmp = dir + ".tmp";
  fs::create_directories(fs::path(tmp).parent_path());
  stage_into(tmp);
  const ExchangeStats st = exchange_directory(comm_, own, next, tmp, prev);
  timing_.bytes += st.received_bytes;
  rename_into_place(tmp, dir);
}

void SnapshotStore::save(const SaveRequest& req, const RankFiles& files, nn::Transformer& model,
                         int64_t pinned) {
  using clock = std::chrono::steady_clock;
  const auto since = [](clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  };
  timing_ = {};
  std::string error;
  auto t = clock::now();
  try {
    const std::string own = write_own_part(req, files, model);
    timing_.write_s = since(t);
    timing_.bytes = directory_bytes(own);
    t = clock::now();
    if (shift_ > 0) exchange_with_neighbours(req.step, own);
    timing_.exchange_s = since(t);
  } catch (const Error& e) {
    error = e.what();
  } catch (const std::exception& e) {  // filesystem errors
    error = str_cat("snapshot of step ", req.step, ": ", e.what());
  }
  t = clock::now();
  agree(comm_, error, req.step);
  steps_.push_back(req.step);
  prune(pinned);
  timing_.agree_s = since(t);
}

void SnapshotStore::prune(int64_t pinned) {
  // Every rank finished steps_.back() (they agreed): older steps are kept
  // only while being persisted. While the next one is written this one is
  // the complete state, so a rank holds at most two steps (own and copy).
  const std::vector<int64_t> keep = {steps_.back(), pinned};
  steps_.erase(steps_.begin(), steps_.end() - 1);
  auto sweep = [&](const fs::path& dir) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      const int64_t step = step_of_name(name);
      const bool stale_tmp = name.starts_with("step-") && name.ends_with(".tmp");
      if (stale_tmp) remove_tree(e.path().string());
      if (step >= 0 && std::find(keep.begin(), keep.end(), step) == keep.end()) drop_step(e.path());
    }
  };
  const fs::path mine = fs::path(root_) / ("rank-" + std::to_string(comm_.rank()));
  sweep(mine);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(mine, ec)) {
    if (e.is_directory() && e.path().filename().string().starts_with("copy-of-")) sweep(e.path());
  }
  if (comm_.rank() != 0) return;
  // Ranks a larger earlier attempt had: nothing of theirs is needed any more.
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("rank-")) continue;
    const std::string digits = name.substr(5);
    if (!digits.empty() && std::all_of(digits.begin(), digits.end(), ::isdigit) &&
        std::stoll(digits) >= comm_.size())
      remove_tree(e.path().string());
  }
}

namespace {

struct Candidate {
  int64_t step;
  std::string job;
  bool operator<(const Candidate& o) const {
    return step != o.step ? step > o.step : job < o.job;  // newest first
  }
};
struct Parts {
  int ranks = 0;
  std::map<int, std::vector<std::string>> dirs;  // by rank: own part first, then copies
};

std::map<Candidate, Parts> scan_parts(const std::string& root) {
  std::map<Candidate, Parts> out;
  std::vector<std::pair<std::string, bool>> dirs;  // (path, is a copy)
  std::error_code ec;
  for (const auto& r : fs::directory_iterator(root, ec)) {
    if (!r.is_directory() || !r.path().filename().string().starts_with("rank-")) continue;
    for (const auto& e : fs::directory_iterator(r.path(), ec)) {
      const std::string name = e.path().filename().string();
      if (step_of_name(name) >= 0) dirs.emplace_back(e.path().string(), false);
      if (!name.starts_with("copy-of-")) continue;
      for (const auto& c : fs::directory_iterator(e.path(), ec)) {
        if (step_of_name(c.path().filename().string()) >= 0)
          dirs.emplace_back(c.path().string(), true);
      }
    }
  }
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? !a.second : a.first < b.first;  // own parts first
  });
  for (const auto& [dir, copy] : dirs) {
    const auto st = part_state(dir);
    if (!st) continue;
    Parts& p = out[{st->at("step").get<int64_t>(), st->at("job_id").get<std::string>()}];
    p.ranks = std::max(p.ranks, st->at("ranks").get<int>());
    p.dirs[st->at("rank").get<int>()].push_back(dir);
  }
  return out;
}

}  // namespace

std::optional<SnapshotSet> latest_snapshot(const std::string& root,
                                           std::vector<std::string>* warnings) {
  for (const auto& [key, parts] : scan_parts(root)) {
    SnapshotSet set{key.step, parts.ranks, {}};
    for (int r = 0; r < parts.ranks; ++r) {
      const auto it = parts.dirs.find(r);
      if (it == parts.dirs.end()) break;
      for (const auto& dir : it->second) {
        try {
          verify_manifest(dir, "snapshot");
          set.part_dirs.push_back(dir);
          break;
        } catch (const Error& e) {
          if (warnings)
            warnings->push_back(str_cat("skipping snapshot part '", dir, "': ", e.what()));
        }
      }
      if (static_cast<int>(set.part_dirs.size()) != r + 1) break;
    }
    if (static_cast<int>(set.part_dirs.size()) == parts.ranks) return set;
    if (warnings) {
      warnings->push_back(str_cat("snapshot of step ", key.step, " is incomplete: rank ",
                                  set.part_dirs.size(), " has no usable part"));
    }
  }
  return std::nullopt;
}

void assemble_snapshot(const SnapshotSet& set, const std::string& dir) {
  remove_tree(dir);
  fs::create_directories(dir);
  nlohmann::json files = nlohmann::json::object();
  std::vector<std::string> model_files;
  nlohmann::json layout = nlohmann::json::object();
  std::string signature;
  for (int r = 0; r < set.ranks; ++r) {
    const std::string& part = set.part_dirs[static_cast<size_t>(r)];
    std::ifstream f(part + "/" + kManifestName);
    const nlohmann::json m = nlohmann::json::parse(f);
    for (const auto& [name, info] : m.at("files").items()) {
      std::error_code ec;
      fs::create_hard_link(part + "/" + name, dir + "/" + name, ec);
      if (ec) fs::copy_file(part + "/" + name, dir + "/" + name);
      files[name] = info;
      if (name == model_file(r)) model_files.push_back(name);
    }
    if (r == 0) {
      layout = m.at("state").at("layout");
      signature = m.at("state").value("model_signature", "");
    }
  }
  nlohmann::json manifest = {
      {"format", "moetron-manifest/1"},
      {"files", files},
      {"state", checkpoint_manifest_state(set.step, set.ranks, model_files, layout, signature)}};
  std::ofstream out(dir + "/" + kManifestName, std::ios::trunc);
  out << manifest.dump(2) << "\n";
  out.flush();
  MOETRON_CHECK(out.good(), "cannot write '", dir, "/", kManifestName, "'");
}

}  // namespace moetron::ckpt
