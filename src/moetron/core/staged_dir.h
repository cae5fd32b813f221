// Atomic publication of a directory of files: everything is written under a
// temporary sibling name, fsync'd, then renamed to the final name in one
// step. A crash or a failed write (disk full) leaves no directory under the
// final name and nothing previously published is touched.
#pragma once

#include <string>
#include <vector>

namespace moetron {

class StagedDir {
 public:
  // Fails if `final_path` already exists (nothing is ever overwritten) or the
  // staging directory cannot be created.
  explicit StagedDir(std::string final_path);
  ~StagedDir();  // removes the staging directory unless committed
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::string& staging_path() const { return staging_; }
  const std::string& final_path() const { return final_; }
  // Path of `name` inside the staging directory.
  std::string file(const std::string& name) const { return staging_ + "/" + name; }
  // fsyncs every file and the directory, renames it to the final name, and
  // fsyncs the parent so the rename itself is durable.
  void commit();

 private:
  std::string final_;
  std::string staging_;
  bool committed_ = false;
};

// Writes `text` to `path` through a temporary sibling renamed into place:
// a failed write leaves no partial file and the previous one untouched.
// Throws naming the path.
void write_file_atomically(const std::string& path, const std::string& text);
// Flushes a file or directory to stable storage; throws naming the path.
void fsync_path(const std::string& path);
// Removes a directory tree; quiet if it does not exist.
void remove_tree(const std::string& path);
// Bytes of the regular files under `dir`, recursively (0 if it does not exist).
int64_t directory_bytes(const std::string& dir);

}  // namespace moetron
