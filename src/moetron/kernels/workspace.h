// Scratch a kernel allocates for itself (MemTag::workspace), reported by the
// kernel family from its own constants and shapes: whoever sizes memory
// ahead of a run (planner/memory_replay.cpp) asks the kernel instead of
// copying its tile sizes and buffer lists, and a test holds each report to
// what the allocator sees when the kernel runs.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/core/dtype.h"

namespace moetron::kernels {

// One allocation of `elems` elements of `dtype`; per_thread: one per thread
// of the kernel's OpenMP team (omp_get_max_threads() when it is called).
struct ScratchBuffer {
  int64_t elems = 0;
  DType dtype = DType::f32;
  bool per_thread = false;
};

// A kernel call's buffers that are held at once at its peak. Buffers of 0
// elements are never listed (the kernel allocates nothing for them).
using Scratch = std::vector<ScratchBuffer>;

// Appends {elems, dtype, per_thread} unless elems is 0.
void add_scratch(Scratch& s, int64_t elems, DType dtype, bool per_thread = false);

// The bytes the allocator counts while `scratch` is held by a team of
// `threads`: each buffer rounded as Allocator::rounded rounds, the
// per-thread ones `threads` times.
int64_t workspace_bytes(const Scratch& scratch, int64_t threads);

}  // namespace moetron::kernels
