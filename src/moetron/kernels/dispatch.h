// Backend dispatch used by the family front-ends (kernels/<family>.cpp).
// Every backend implements the same signature, Context first. Before
// dispatching, every defined Tensor argument is checked to live on the
// context's device (a host kernel handed device memory, or the reverse,
// would read garbage or fault instead of failing with a message).
//
// Families with a CUDA implementation declare it with MOETRON_KERNEL_DECL_CUDA
// and dispatch with MOETRON_KERNEL_DISPATCH_CUDA; the others fail on a CUDA
// context with "no implementation for backend cuda". MOETRON_HAVE_CUDA (0 or 1,
// set by CMake) keeps builds without CUDA from naming the CUDA functions.
#pragma once

#include "moetron/core/error.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"

namespace moetron::kernels::detail {

inline void check_device(const Context& ctx, const char* fn, int& index, const Tensor& t) {
  ++index;
  MOETRON_CHECK(!t.defined() || t.device() == ctx.device(), fn, ": argument ", index, " (", t.str(),
                ") is on ", device_name(t.device()), " but the context runs the ",
                backend_name(ctx.backend()), " backend, whose tensors live on ",
                device_name(ctx.device()));
}
template <typename T>
void check_device(const Context&, const char*, int& index, const T&) {
  ++index;
}

template <typename... Args>
void check_devices(const Context& ctx, const char* fn, const Args&... args) {
  int index = 0;
  (check_device(ctx, fn, index, args), ...);
}

}  // namespace moetron::kernels::detail

#define MOETRON_KERNEL_CUDA_CASE_NONE(ctx, fn, ...) break
#define MOETRON_KERNEL_CUDA_CASE(ctx, fn, ...)               \
  if constexpr (MOETRON_HAVE_CUDA) {                         \
    return ::moetron::kernels::cuda::fn((ctx), __VA_ARGS__); \
  }                                                          \
  break

#define MOETRON_KERNEL_DISPATCH_WITH(cuda_case, ctx, fn, ...)                            \
  do {                                                                                   \
    ::moetron::kernels::detail::check_devices((ctx), #fn, __VA_ARGS__);                  \
    const ::moetron::kernels::ScopedKernelTimer moetron_kernel_timer_((ctx), #fn);       \
    switch ((ctx).backend()) {                                                           \
      case ::moetron::kernels::Backend::reference:                                       \
        return ::moetron::kernels::reference::fn((ctx), __VA_ARGS__);                    \
      case ::moetron::kernels::Backend::cpu:                                             \
        return ::moetron::kernels::cpu::fn((ctx), __VA_ARGS__);                          \
      case ::moetron::kernels::Backend::cuda:                                            \
        cuda_case(ctx, fn, __VA_ARGS__);                                                 \
    }                                                                                    \
    MOETRON_FAIL(#fn ": no implementation for backend ", backend_name((ctx).backend())); \
  } while (0)

#define MOETRON_KERNEL_DISPATCH(ctx, fn, ...) \
  MOETRON_KERNEL_DISPATCH_WITH(MOETRON_KERNEL_CUDA_CASE_NONE, ctx, fn, __VA_ARGS__)
#define MOETRON_KERNEL_DISPATCH_CUDA(ctx, fn, ...) \
  MOETRON_KERNEL_DISPATCH_WITH(MOETRON_KERNEL_CUDA_CASE, ctx, fn, __VA_ARGS__)

// Declares `decl` in the front-end namespace and in each backend namespace.
#define MOETRON_KERNEL_DECL(decl) \
  decl;                           \
  namespace reference {           \
  decl;                           \
  }                               \
  namespace cpu {                 \
  decl;                           \
  }
// The same, for a kernel the CUDA backend implements too.
#define MOETRON_KERNEL_DECL_CUDA(decl) \
  MOETRON_KERNEL_DECL(decl)            \
  namespace cuda {                     \
  decl;                                \
  }
