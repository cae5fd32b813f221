#include "moetron/core/rng.h"

#include <xxhash.h>

#include <cmath>

namespace moetron {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void philox_round(PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

inline PhiloxCounter counter_of(uint64_t index) {
  return {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u};
}

inline float to_unit(uint32_t x) {  // top 24 bits -> [0, 1)
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

template <typename Gen>
void fill_with(Tensor& dst, Gen gen) {
  const int64_t n = dst.numel();
  switch (dst.dtype()) {
    case DType::f32: {
      float* p = dst.data<float>();
      for (int64_t j = 0; j < n; ++j) p[j] = gen(j);
      break;
    }
    case DType::f64: {
      double* p = dst.data<double>();
      for (int64_t j = 0; j < n; ++j) p[j] = gen(j);
      break;
    }
    case DType::bf16: {
      auto* p = static_cast<uint16_t*>(dst.raw());
      for (int64_t j = 0; j < n; ++j) p[j] = f32_to_bf16(gen(j));
      break;
    }
    case DType::f16: {
      auto* p = static_cast<uint16_t*>(dst.raw());
      for (int64_t j = 0; j < n; ++j) p[j] = f32_to_f16(gen(j));
      break;
    }
    default:
      MOETRON_FAIL("random fill needs a float tensor, got ", dst.str());
  }
}
}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    philox_round(counter, key);
    if (r < 9) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
  }
  return counter;
}

PhiloxKey philox_key(uint64_t seed, std::string_view name) {
  const uint64_t h = XXH64(name.data(), name.size(), seed);
  return {static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32)};
}

float uniform_at(PhiloxKey key, uint64_t index) {
  return to_unit(philox4x32_10(counter_of(index), key)[0]);
}

float normal_at(PhiloxKey key, uint64_t index) {
  const PhiloxCounter r = philox4x32_10(counter_of(index), key);
  // u1 in (0, 1] so the log is finite.
  const double u1 = (static_cast<double>(r[0] >> 8) + 1.0) / 16777216.0;
  const double u2 = static_cast<double>(r[1] >> 8) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void fill_uniform(Tensor& dst, uint64_t seed, std::string_view name, float lo, float hi,
                  uint64_t first_index) {
  const PhiloxKey key = philox_key(seed, name);
  fill_with(dst, [&](int64_t j) {
    return lo + (hi - lo) * uniform_at(key, first_index + static_cast<uint64_t>(j));
  });
}

void fill_normal(Tensor& dst, uint64_t seed, std::string_view name, float mean, float stddev,
                 uint64_t first_index) {
  const PhiloxKey key = philox_key(seed, name);
  fill_with(dst, [&](int64_t j) {
    return mean + stddev * normal_at(key, first_index + static_cast<uint64_t>(j));
  });
}

void fill_normal_block(Tensor& dst, uint64_t seed, std::string_view name, float mean, float stddev,
                       int64_t full_cols, int64_t row0, int64_t col0) {
  MOETRON_CHECK(dst.rank() == 2, "fill_normal_block needs a 2-D tensor, got ", dst.str());
  const int64_t cols = dst.dim(1);
  MOETRON_CHECK(col0 + cols <= full_cols, "block columns [", col0, ", ", col0 + cols,
                ") exceed the parameter's ", full_cols, " columns");
  const PhiloxKey key = philox_key(seed, name);
  fill_with(dst, [&](int64_t j) {
    const int64_t r = j / cols, c = j % cols;
    return mean + stddev * normal_at(key, static_cast<uint64_t>((row0 + r) * full_cols + col0 + c));
  });
}

uint32_t PhiloxStream::next_u32() {
  const uint64_t block = position_ / 4;
  const auto word = static_cast<size_t>(position_ % 4);
  ++position_;
  return philox4x32_10(counter_of(block), key_)[word];
}

float PhiloxStream::next_uniform() {
  return to_unit(next_u32());
}

}  // namespace moetron
