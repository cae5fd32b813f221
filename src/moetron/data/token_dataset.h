// A prepared corpus split (train.bin or val.bin) memory-mapped read-only,
// and the deterministic sampler that cuts training windows from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/rng.h"

namespace moetron::data {

class TokenFile {
 public:
  // Maps `path` (raw little-endian int32 ids); checks every id is in [0, vocab_size)
  // when vocab_size > 0, naming the file and the offset of a bad id.
  explicit TokenFile(const std::string& path, int64_t vocab_size = 0);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  const int32_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  const int32_t* data_ = nullptr;
  int64_t size_ = 0;
};

// Sample i of the run is a window of window_len tokens starting at a position
// drawn from Philox(seed, "data.sampler", i): a pure function of i, so the
// sampler's whole state is the number of samples drawn (saved in checkpoints),
// and a dp rank can draw its own slice of the global batch without the others.
// With align > 1 windows start only at multiples of align (a corpus of
// fixed-length examples, data/retrieval.h, read one example per window).
class WindowSampler {
 public:
  WindowSampler(const TokenFile& file, int64_t window_len, uint64_t seed, int64_t align = 1);
  // Start offset of sample `index`.
  int64_t start_of(uint64_t index) const;
  // Copies sample `index` into dst (window_len ids).
  void fill(uint64_t index, int32_t* dst) const;
  int64_t window_len() const { return window_; }

 private:
  const TokenFile& file_;
  int64_t window_;
  int64_t align_;
  PhiloxKey key_;
};

}  // namespace moetron::data
