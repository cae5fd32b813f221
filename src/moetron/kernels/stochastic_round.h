// Stochastic rounding of fp32 to bf16, for bf16 master weights
// (optim.master_dtype = "bf16"): an update far below a bf16 ulp of the
// weight (lr x update ~ 1e-5 against an ulp of 2^-8 at |w| ~ 0.5) is lost
// every step by round-to-nearest, but kept in expectation when the result
// rounds up with probability equal to its distance from the value below
// (Gupta et al. 2015; Zamirai et al. 2020 for bf16 training).
//
// The random bits come from a counter-based hash of (key, element index),
// not a stateful generator: every backend, thread count and data-parallel
// replica draws the same bits for the same element of the same parameter at
// the same step, so replicas stay identical and a resumed run repeats the
// uninterrupted one bit for bit. The key mixes a seed, the parameter's name
// and the step (rounding_key).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#ifdef __CUDACC__
#define MOETRON_HOST_DEVICE __host__ __device__
#else
#define MOETRON_HOST_DEVICE
#endif

namespace moetron::kernels {

// 32 mixed bits of (key, index): a multiplicative step by the golden ratio
// then Wellons' lowbias32 finaliser. 32-bit integer operations only, so the
// CPU loop vectorises.
MOETRON_HOST_DEVICE inline uint32_t rounding_bits(uint32_t key, uint32_t index) {
  uint32_t x = index * 0x9E3779B9u + key;
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

// bf16 bits of the fp32 value with bits `u`, rounded away from zero with
// probability (|x| - |down|) / ulp: 16 random bits added below the kept 16,
// then truncated. The carry of a value just below a power of two moves it
// into the next binade, which is that binade's first value: still a
// neighbour. Inf passes through; NaN stays a (quiet) NaN, as with
// round-to-nearest.
MOETRON_HOST_DEVICE inline uint16_t bf16_bits_stochastic(uint32_t u, uint32_t random) {
  if ((u & 0x7f800000u) == 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | ((u & 0x007fffffu) != 0 ? 0x40u : 0u));
  }
  return static_cast<uint16_t>((u + (random & 0xffffu)) >> 16);
}

// x stochastically rounded to bf16 bits with element `index`'s bits under
// `key` (host code; device code calls bf16_bits_stochastic on its own bits).
inline uint16_t bf16_stochastic(float x, uint32_t key, int64_t index) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return bf16_bits_stochastic(u, rounding_bits(key, static_cast<uint32_t>(index)));
}

// The key of one parameter's rounding at one optimizer step: FNV-1a of the
// name (stable over layouts and runs), mixed with the seed and the step.
inline uint32_t rounding_key(uint64_t seed, std::string_view param_name, int64_t step) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (char c : param_name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  h ^= static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<uint32_t>(h >> 32);
}

}  // namespace moetron::kernels
