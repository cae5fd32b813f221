// What the rest of moetron knows about device memory, without CUDA headers:
// whether a GPU is usable, its caching allocator, pinned host memory, and
// explicit copies between host and device. Built with the CUDA backend
// (CMake MOETRON_CUDA) from core/cuda/device.cpp; without it from
// core/device_nocuda.cpp, where no device is ever visible and asking for
// device memory is an error naming the build option.
//
// There is no managed (unified) memory: a byte lives on the host or on the
// device, and moves only through copy_bytes (or an explicit async copy on a
// stream, core/cuda/stream.h).
#pragma once

#include <cstddef>
#include <string>

#include "moetron/core/allocator.h"

namespace moetron {

// Whether this build has the CUDA backend.
bool cuda_built();

// Number of CUDA devices this process can use; 0 when there is none, the
// driver is missing or the build has no CUDA backend, and then `why` (when
// not null) says which.
int cuda_device_count(std::string* why = nullptr);

// The caching allocator of device `device`'s memory, one per device per
// process (the honest model of a GPU's memory, as cpu_allocator() is of the
// host's): per-tag current and peak bytes exactly as the host allocator
// counts them. Blocks of every size are cached and reused in the order their
// tensors are freed; that is safe for work queued on one stream (the kernel
// context's), and a tensor read or written on another stream must be
// synchronised with before it is dropped. Throws when the device does not exist.
Allocator& cuda_allocator(int device = 0);

// Page-locked host memory (cudaMallocHost), counted and cached like the host
// heap but in its own allocator: copies from and to it run at full PCIe/NVLink
// speed and can be asynchronous. Tensors from it are Device::cpu tensors.
Allocator& pinned_allocator();

// Copies `bytes` from src to dst, either of them host or device memory.
// Returns when src may be reused and, for a copy to the host, dst holds the
// bytes. Issued on the legacy default stream: it starts after all work
// already queued on blocking streams (the kernel context's stream is one),
// and work queued on them afterwards sees the bytes.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// Sets `bytes` bytes at dst to `value` (synchronous, ordered as copy_bytes).
void set_bytes(void* dst, Device device, int value, size_t bytes);

}  // namespace moetron
