// State the CPU backend keeps between kernel calls: the oneDNN engine and
// stream, and primitives created once per shape/dtype and reused.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <string>
#include <unordered_map>

namespace moetron::kernels::cpu {

struct CpuState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // Keyed by a string that spells out everything the primitive depends on
  // (kind, shapes, dtypes, transposes, post-ops); lookups cost ~100 ns,
  // negligible next to the GEMMs they guard.
  std::unordered_map<std::string, dnnl::primitive> primitives;
};

}  // namespace moetron::kernels::cpu
