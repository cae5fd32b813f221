#include "moetron/core/cuda/stream.h"

#include "moetron/core/error.h"

namespace moetron::gpu {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    MOETRON_FAIL(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  }
}

void set_device(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
}

Stream::Stream(int device, bool blocking) : device_(device) {
  set_device(device);
  check(cudaStreamCreateWithFlags(&stream_, blocking ? cudaStreamDefault : cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags");
}

Stream::~Stream() {
  // Destroying a stream with work queued is legal (the work still runs);
  // errors cannot be thrown from here and would surface at the next call.
  cudaStreamDestroy(stream_);
}

void Stream::synchronize() const {
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void Stream::wait(const Event& event) const {
  check(cudaStreamWaitEvent(stream_, event.get(), 0), "cudaStreamWaitEvent");
}

Event::Event(bool timing) {
  check(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
}

Event::~Event() {
  cudaEventDestroy(event_);
}

void Event::record(const Stream& stream) {
  check(cudaEventRecord(event_, stream.get()), "cudaEventRecord");
}

bool Event::done() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}

void Event::synchronize() const {
  check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
  return ms;
}

bool is_pinned(const void* p) {
  cudaPointerAttributes attr{};
  check(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes");
  return attr.type == cudaMemoryTypeHost;
}

void copy_async(const Tensor& dst, const Tensor& src, const Stream& stream) {
  MOETRON_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy_async ", src.str(),
                " into ", dst.str());
  if (dst.nbytes() == 0) return;
  for (const Tensor* t : {&dst, &src}) {
    MOETRON_CHECK(t->device() == Device::cuda || is_pinned(t->raw()), "copy_async: host tensor ",
                  t->str(), " is not in pinned memory (use pinned_allocator()): the copy would ",
                  "not be asynchronous");
  }
  check(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, stream.get()),
        "cudaMemcpyAsync");
}

}  // namespace moetron::gpu
