#include "moetron/core/overwrite_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "moetron/core/error.h"

namespace moetron {

OverwriteFile::OverwriteFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  MOETRON_CHECK(fd_ >= 0, "cannot open '", path_, "' for writing: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && st.st_nlink > 1) {
    // Shared with another name: give this name a file of its own.
    ::close(fd_);
    fd_ = -1;
    MOETRON_CHECK(::unlink(path_.c_str()) == 0, "cannot replace '", path_,
                  "': ", std::strerror(errno));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    MOETRON_CHECK(fd_ >= 0, "cannot open '", path_, "' for writing: ", std::strerror(errno));
  }
  // Last: a constructor that throws leaves nothing to free.
  hash_ = XXH64_createState();
  XXH64_reset(static_cast<XXH64_state_t*>(hash_), 0);
}

OverwriteFile::~OverwriteFile() {
  if (fd_ >= 0) ::close(fd_);
  XXH64_freeState(static_cast<XXH64_state_t*>(hash_));
}

std::string OverwriteFile::checksum() const {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(XXH64_digest(static_cast<XXH64_state_t*>(hash_))));
  return hex;
}

void OverwriteFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  XXH64_update(static_cast<XXH64_state_t*>(hash_), p, n);
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    MOETRON_CHECK(k > 0, "write to '", path_,
                  "' failed: ", k < 0 ? std::strerror(errno) : "no progress");
    p += k;
    n -= static_cast<size_t>(k);
    written_ += k;
  }
}

void OverwriteFile::finish() {
  MOETRON_CHECK(::ftruncate(fd_, written_) == 0, "cannot cut '", path_, "' to ", written_,
                " bytes: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  MOETRON_CHECK(::close(fd) == 0, "closing '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace moetron
