// State the CPU backend keeps between kernel calls: the oneDNN engine and
// stream, primitives created once per configuration and reused, and a
// growable scratch buffer for kernels that need an fp32 staging area.
#pragma once

#include <xxhash.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "moetron/core/tensor.h"

namespace moetron::kernels::cpu {

// Everything a cached primitive depends on, as a fixed array of integers
// (floats stored as their bit patterns). Field 0 names the primitive kind so
// families never collide; the meaning of the other fields is the kind's own.
// A fixed-size POD key hashes with one XXH3 call and compares with memcmp:
// ~20 ns per lookup instead of building and hashing a string.
struct PrimitiveKey {
  static constexpr size_t kFields = 16;
  std::array<int64_t, kFields> f{};

  bool operator==(const PrimitiveKey& o) const {
    return std::memcmp(f.data(), o.f.data(), sizeof(f)) == 0;
  }
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& k) const noexcept {
    return static_cast<size_t>(XXH3_64bits(k.f.data(), sizeof(k.f)));
  }
};

inline int64_t float_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<int64_t>(u);
}

// A cached primitive with the argument map it is executed with. For a
// fixed-shape primitive the memory objects are made once and only their data
// pointers change per call (set_data_handle): building three dnnl::memory
// objects and the map costs ~2 us of malloc per call otherwise. A primitive
// with run-time dimensions leaves `args` empty and gets fresh ones.
struct CachedPrimitive {
  dnnl::primitive primitive;
  std::unordered_map<int, dnnl::memory> args;
};

struct CpuState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // Keyed by a string that spells out everything the primitive depends on
  // (kind, shapes, dtypes, transposes, post-ops). Kept for families that
  // prefer readable keys; lookups cost ~100 ns.
  std::unordered_map<std::string, dnnl::primitive> primitives;
  // Keyed by a PrimitiveKey: the hot-path cache (matmul family).
  std::unordered_map<PrimitiveKey, CachedPrimitive, PrimitiveKeyHash> keyed_primitives;

  // fp32 staging memory, grown on demand and reused (counted as workspace).
  // Slot 0: a GEMM's fp32 output before rounding to bf16; slots 1 and 2: a
  // bf16 GEMM's operands widened to fp32 where oneDNN has no bf16 matmul.
  static constexpr int kScratchSlots = 3;
  float* scratch_f32(int64_t n, int slot = 0) {
    Tensor& s = scratch_[static_cast<size_t>(slot)];
    if (!s.defined() || s.numel() < n) s = Tensor::empty({n}, DType::f32, MemTag::workspace);
    return static_cast<float*>(s.raw());
  }
  // Whether oneDNN runs bf16 x bf16 matmuls on this CPU (2.6 needs
  // AVX512_CORE for them); -1 until first asked.
  int native_bf16_matmul = -1;

 private:
  std::array<Tensor, kScratchSlots> scratch_;
};

}  // namespace moetron::kernels::cpu
