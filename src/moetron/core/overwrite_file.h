// Writing a file from its start while keeping the pages it already has.
// Truncating a file on tmpfs frees its pages, and writing it again faults in
// fresh zeroed ones (about 270 MB/s on the 2-core VM, most of an in-memory
// snapshot's time); overwriting in place only copies. In-memory snapshots
// recycle the files of the step they drop, so every snapshot after the
// first writes into pages that are already there.
//
// A file with another hard link (a checkpoint assembled from it) is replaced
// by a new one, never changed under the other name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moetron {

class OverwriteFile {
 public:
  // Opens (or creates) `path` for writing at offset 0; throws naming it.
  explicit OverwriteFile(std::string path);
  ~OverwriteFile();  // closes; a file never finished keeps stale bytes past what was written
  OverwriteFile(const OverwriteFile&) = delete;
  OverwriteFile& operator=(const OverwriteFile&) = delete;

  void write(const void* data, size_t n);
  // Cuts the file to the bytes written and closes it; throws naming the path.
  void finish();
  int64_t written() const { return written_; }
  // xxHash64 of the bytes written, as 16 hex digits (file_checksum's form):
  // computed from memory as they are written, so a manifest need not read
  // the file back.
  std::string checksum() const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0;
  void* hash_ = nullptr;  // XXH64_state_t
};

}  // namespace moetron
