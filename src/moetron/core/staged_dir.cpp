#include "moetron/core/staged_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moetron/core/error.h"

namespace moetron {

namespace fs = std::filesystem;

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MOETRON_CHECK(fd >= 0, "cannot open '", path, "' to sync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MOETRON_CHECK(rc == 0, "fsync of '", path, "' failed: ", std::strerror(err));
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

int64_t directory_bytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += static_cast<int64_t>(e.file_size(ec));
  }
  return total;
}

StagedDir::StagedDir(std::string final_path) : final_(std::move(final_path)) {
  while (final_.size() > 1 && final_.back() == '/') final_.pop_back();
  MOETRON_CHECK(!fs::exists(final_), "'", final_, "' already exists; refusing to overwrite it");
  const fs::path parent = fs::path(final_).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  staging_ = final_ + ".tmp-" + std::to_string(::getpid());
  remove_tree(staging_);  // a leftover from a crashed run of this pid number
  std::error_code ec;
  fs::create_directory(staging_, ec);
  MOETRON_CHECK(!ec, "cannot create staging directory '", staging_, "': ", ec.message());
}

StagedDir::~StagedDir() {
  if (!committed_) remove_tree(staging_);
}

void StagedDir::commit() {
  MOETRON_CHECK(!committed_, "'", final_, "' committed twice");
  for (const auto& entry : fs::directory_iterator(staging_)) {
    if (entry.is_regular_file()) fsync_path(entry.path().string());
  }
  fsync_path(staging_);
  MOETRON_CHECK(!fs::exists(final_), "'", final_, "' appeared while staging; not overwriting it");
  if (::rename(staging_.c_str(), final_.c_str()) != 0) {
    MOETRON_FAIL("cannot rename '", staging_, "' to '", final_, "': ", std::strerror(errno));
  }
  committed_ = true;
  const fs::path parent = fs::path(final_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MOETRON_CHECK(f.good(), "cannot write '", tmp, "': ", std::strerror(errno));
    f << text;
    f.close();
    if (!f.good()) {
      std::remove(tmp.c_str());
      MOETRON_FAIL("writing '", tmp, "' failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    MOETRON_FAIL("cannot rename '", tmp, "' to '", path, "': ", why);
  }
}

}  // namespace moetron
