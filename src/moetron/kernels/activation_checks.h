// Argument checks shared by the activation backends (internal to kernels/):
// same rules, same messages, all run before anything is written.
#pragma once

#include "moetron/kernels/activation.h"

namespace moetron::kernels::activation_detail {

// gate_up [T, 2F]; out (named name) [T, F] of gate_up's dtype. Returns F.
inline int64_t check_swiglu(const char* fn, const Tensor& gate_up, const Tensor& out,
                            const char* name) {
  MOETRON_CHECK(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0, fn,
                ": gate_up must be [T, 2F], got ", gate_up.str());
  const int64_t F = gate_up.dim(1) / 2;
  check_tensor(out, name, {gate_up.dim(0), F}, gate_up.dtype());
  return F;
}

}  // namespace moetron::kernels::activation_detail
