// CUDA streams and events, owned: created on a given device, destroyed with
// the object, every failure an Error carrying cudaGetErrorString. Only code
// built with the CUDA backend includes this (it pulls in the CUDA runtime).
#pragma once

#include <cuda_runtime_api.h>

#include "moetron/core/tensor.h"

namespace moetron::gpu {

// Throws moetron::Error "<what>: <cuda error name>: <message>" unless e is cudaSuccess.
void check(cudaError_t e, const char* what);

// Makes `device` the calling thread's current device (CUDA keeps it per thread).
void set_device(int device);

class Event;

class Stream {
 public:
  // blocking: the stream synchronises with the legacy default stream, so the
  // synchronous copies of core/device.h are ordered with its work. A
  // non-blocking stream (communication overlapped with compute) is ordered
  // only by events.
  explicit Stream(int device, bool blocking = true);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  // Returns when everything queued so far has finished (errors of kernels surface here).
  void synchronize() const;
  // Work queued after this call waits for `event` (recorded on any stream).
  void wait(const Event& event) const;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  // timing: the event records a time stamp, for elapsed_ms (slightly slower to record).
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  // Marks the point after the work queued on `stream` so far.
  void record(const Stream& stream);
  // Whether that work has finished (no wait).
  bool done() const;
  void synchronize() const;
  // Milliseconds between `start` and this event, both timing events, both finished.
  float elapsed_ms(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Queues a copy of src into dst (same shape and dtype; either on the host or
// the device) on `stream` and returns at once. A host tensor must come from
// pinned_allocator() (a pageable one would make the copy synchronous and is
// refused) and must stay alive and untouched until the stream has passed it.
void copy_async(const Tensor& dst, const Tensor& src, const Stream& stream);

// Whether p points into page-locked host memory (cudaMallocHost/cudaHostAlloc).
bool is_pinned(const void* p);

}  // namespace moetron::gpu
