// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
//
// Element i of a named tensor is a pure function of (seed, name, i): the key
// is derived from the seed and a hash of the name, the counter is i. A shard
// of a parameter is therefore initialised alone, without materialising the
// whole tensor, and equals the same slice of the full tensor on every layout.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "moetron/core/tensor.h"

namespace moetron {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// Key for the stream named `name` under `seed` (xxHash64 of the name mixed with the seed).
PhiloxKey philox_key(uint64_t seed, std::string_view name);

// Uniform in [0, 1) with 24 random bits, from word 0 of counter (index, 0, 0, 0).
float uniform_at(PhiloxKey key, uint64_t index);
// Standard normal by Box-Muller from words 0 and 1 of counter (index, 0, 0, 0).
float normal_at(PhiloxKey key, uint64_t index);

// Fills `dst` (any float dtype) with element j = dist(first_index + j). For a
// row shard of a [rows, cols] parameter starting at row r0 pass first_index = r0 * cols.
void fill_uniform(Tensor& dst, uint64_t seed, std::string_view name, float lo, float hi,
                  uint64_t first_index = 0);
void fill_normal(Tensor& dst, uint64_t seed, std::string_view name, float mean, float stddev,
                 uint64_t first_index = 0);
// A 2-D block [row0, row0 + dst.dim(0)) x [col0, col0 + dst.dim(1)) of a
// parameter with `full_cols` columns: element (r, c) uses index (row0 + r) * full_cols + col0 + c.
void fill_normal_block(Tensor& dst, uint64_t seed, std::string_view name, float mean, float stddev,
                       int64_t full_cols, int64_t row0, int64_t col0);

// A small sequential generator over the same Philox stream, for sampling and
// shuffling: state is (key, position), so it checkpoints as two numbers.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, std::string_view name) : key_(philox_key(seed, name)) {}
  uint32_t next_u32();
  float next_uniform();  // [0, 1)
  uint64_t position() const { return position_; }
  void set_position(uint64_t p) { position_ = p; }

 private:
  PhiloxKey key_;
  uint64_t position_ = 0;
};

}  // namespace moetron
