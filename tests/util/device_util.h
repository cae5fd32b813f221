// Helpers for tests that run a kernel on the CUDA backend as well: skip,
// saying why, where no GPU can be used (a skip, not a pass: CTest reports
// it), and move tensors between the host and the context's device.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"

namespace moetron::test {

// Whether a CUDA context can run here; `why` says why not ("built without
// CUDA ...", "no CUDA device: ...").
bool gpu_available(std::string* why);

// A copy of host tensor t on ctx's device (t itself on the CPU backends).
Tensor on_device(const kernels::Context& ctx, const Tensor& t);
// A host copy of t (t itself when it is on the host).
Tensor on_host(const Tensor& t);
// An uninitialised tensor on ctx's device.
Tensor empty_on(const kernels::Context& ctx, const Shape& shape, DType dtype);

}  // namespace moetron::test

// Ends the test as skipped, with the reason, when no GPU can be used.
#define MOETRON_SKIP_WITHOUT_GPU()                                                    \
  do {                                                                                \
    std::string moetron_why_;                                                         \
    if (!::moetron::test::gpu_available(&moetron_why_)) GTEST_SKIP() << moetron_why_; \
  } while (0)
