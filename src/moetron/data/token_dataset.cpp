#include "moetron/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "moetron/core/error.h"

namespace moetron::data {

TokenFile::TokenFile(const std::string& path, int64_t vocab_size) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MOETRON_CHECK(fd >= 0, "cannot open token file '", path, "': ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ % 4 != 0) {
    ::close(fd);
    MOETRON_FAIL("token file '", path, "' has ", bytes_, " bytes, not a multiple of 4 (int32 ids)");
  }
  if (bytes_ > 0) map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MOETRON_CHECK(map_ != MAP_FAILED, "cannot map token file '", path, "'");
  data_ = static_cast<const int32_t*>(map_);
  size_ = static_cast<int64_t>(bytes_ / 4);
  if (vocab_size > 0) {
    for (int64_t i = 0; i < size_; ++i) {
      if (data_[i] < 0 || data_[i] >= vocab_size) {
        const int32_t bad = data_[i];
        ::munmap(map_, bytes_);
        MOETRON_FAIL("token file '", path, "': id ", bad, " at position ", i,
                     " is outside the vocabulary [0, ", vocab_size, ")");
      }
    }
  }
}

TokenFile::~TokenFile() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, bytes_);
}

WindowSampler::WindowSampler(const TokenFile& file, int64_t window_len, uint64_t seed,
                             int64_t align)
    : file_(file), window_(window_len), align_(align), key_(philox_key(seed, "data.sampler")) {
  MOETRON_CHECK(align >= 1, "window alignment must be >= 1, got ", align);
  MOETRON_CHECK(file.size() >= window_len, "token file '", file.path(), "' has ", file.size(),
                " tokens, fewer than one window of ", window_len);
}

int64_t WindowSampler::start_of(uint64_t index) const {
  // Aligned starts 0, align, ..., the last one leaving a whole window.
  const auto span = static_cast<uint64_t>((file_.size() - window_) / align_ + 1);
  const PhiloxCounter r =
      philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0}, key_);
  const uint64_t x = (static_cast<uint64_t>(r[0]) << 32) | r[1];
  return static_cast<int64_t>(x % span) * align_;  // bias < span / 2^64: negligible
}

void WindowSampler::fill(uint64_t index, int32_t* dst) const {
  std::memcpy(dst, file_.data() + start_of(index), static_cast<size_t>(window_) * 4);
}

}  // namespace moetron::data
