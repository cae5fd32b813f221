// Backend dispatch used by the family front-ends (kernels/<family>.cpp).
// Every backend implements the same signature, Context first.
#pragma once

#include "moetron/core/error.h"
#include "moetron/kernels/context.h"

#define MOETRON_KERNEL_DISPATCH(ctx, fn, ...)                                        \
  do {                                                                               \
    const ::moetron::kernels::ScopedKernelTimer moetron_kernel_timer_((ctx), #fn);   \
    switch ((ctx).backend()) {                                                       \
      case ::moetron::kernels::Backend::reference:                                   \
        return ::moetron::kernels::reference::fn((ctx), __VA_ARGS__);                \
      case ::moetron::kernels::Backend::cpu:                                         \
        return ::moetron::kernels::cpu::fn((ctx), __VA_ARGS__);                      \
      case ::moetron::kernels::Backend::cuda:                                        \
        break;                                                                       \
    }                                                                                \
    MOETRON_FAIL(#fn ": no implementation for backend ", backend_name((ctx).backend())); \
  } while (0)

// Declares `decl` in the front-end namespace and in each backend namespace.
#define MOETRON_KERNEL_DECL(decl) \
  decl;                           \
  namespace reference {           \
  decl;                           \
  }                               \
  namespace cpu {                 \
  decl;                           \
  }
