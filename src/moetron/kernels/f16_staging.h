// fp16 on a CPU without fp16 arithmetic (no AVX512-FP16 here, and oneDNN 2.6
// has no fp16 GEMM without it): fp16 is a storage format. A kernel called on
// f16 tensors on the CPU backend runs its f32 implementation on staged f32
// copies; outputs are rounded back to f16 (nearest even) when the call ends.
// The numerics are those of fp16 storage with fp32 math, like bf16 here; the
// cost is the conversion traffic. The reference backend reads f16 directly.
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/workspace.h"

namespace moetron::kernels {

// True when ctx runs the CPU backend and any of `tensors` is f16.
bool needs_f16_staging(const Context& ctx, std::initializer_list<const Tensor*> tensors);

class F16Staging {
 public:
  explicit F16Staging(Context& ctx) : ctx_(ctx) {}
  F16Staging(const F16Staging&) = delete;
  F16Staging& operator=(const F16Staging&) = delete;

  // An f32 view of an input: a converted copy for f16, the tensor itself otherwise.
  Tensor in(const Tensor& t);
  // An f32 buffer for an output, written back to t by finish(). `read`: the
  // kernel reads the output too (accumulates, beta != 0). Aliases of a tensor
  // already staged by in() share its buffer (in-place kernels).
  Tensor out(const Tensor& t, bool read = false);
  void finish();

 private:
  struct Entry {
    Tensor original;  // f16
    Tensor copy;      // f32
    bool filled = false;
    bool output = false;
  };
  // The entry of t (created if new); filled from t when `fill`. Arguments of
  // one call are staged in unspecified order, so an input staged after an
  // aliasing output still gets filled.
  Entry& staged(const Tensor& t, bool fill);
  Context& ctx_;
  std::vector<Entry> entries_;
};

// The workspace a front-end call on `backend` holds (kernels/workspace.h).
// CPU: when its tensors are f16 (`f16`), one staged f32 copy per distinct
// f16 tensor, inputs and outputs alike (`staged`: their element counts),
// allocated first and held throughout; then the f32/bf16 kernel's own
// scratch, cpu_scratch(). Reference: nothing (its doubles live in uncounted
// vectors).
template <typename CpuScratch>
Scratch call_scratch(const char* fn, Backend backend, bool f16,
                     std::initializer_list<int64_t> staged, CpuScratch&& cpu_scratch) {
  switch (backend) {
    case Backend::reference:
      return {};
    case Backend::cpu:
      break;
    case Backend::cuda:
      MOETRON_FAIL(fn, ": no implementation for backend cuda");
  }
  Scratch s;
  if (f16) {
    for (int64_t n : staged) add_scratch(s, n, DType::f32);
  }
  const Scratch own = cpu_scratch();
  s.insert(s.end(), own.begin(), own.end());
  return s;
}

// Runs body(staging) as kernel `fn` (timed by the profiler) and writes the
// staged outputs back.
template <typename Body>
void run_f16_staged(Context& ctx, const char* fn, Body&& body) {
  const ScopedKernelTimer timer(ctx, fn);
  F16Staging staging(ctx);
  body(staging);
  staging.finish();
}

}  // namespace moetron::kernels
