// AdamW with decoupled weight decay on fp32 master weights.
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

struct AdamWArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;         // 1-based, for bias correction
  float grad_scale = 1.0f;  // multiplies the gradient first (loss-scale undo, clipping)
  // > 0: the second moment was frozen after this step (1-bit Adam's
  // compression stage): for step > variance_frozen_at, v is left as it is
  // and its bias correction stays that of step variance_frozen_at, so the
  // update is linear in the gradients (what error feedback needs).
  int64_t variance_frozen_at = 0;
  bool variance_frozen() const { return variance_frozen_at > 0 && step > variance_frozen_at; }
  // The step whose bias correction v carries.
  int64_t variance_step() const { return variance_frozen() ? variance_frozen_at : step; }
  // A bf16 master (optim.master_dtype = "bf16") is stored stochastically
  // rounded, element i with rounding_bits(rounding_key, i)
  // (kernels/stochastic_round.h); an f32 master ignores it.
  uint32_t rounding_key = 0;
};

// g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// master -= lr * (wd * master + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)).
// With the variance frozen at step f < t: v unchanged and 1-b2^f in place of 1-b2^t.
// master: f32 [n] (reference also f64), or bf16 [n]: bf16 master weights,
// loaded into fp32, updated there and stored with stochastic rounding keyed
// by args.rounding_key (then there is no separate working copy: param_copy
// must be undefined); m, v: [n], both f32 or both bf16
// (reference: the master's dtype or bf16) — bf16 moments are loaded into
// fp32, updated, used for the update, then stored rounded to nearest even;
// grad: f32 or bf16 [n];
// param_copy: undefined, or [n] f32/bf16 receiving the updated master (the working copy).
MOETRON_KERNEL_DECL_CUDA(void adamw_step(Context& ctx, const Tensor& master, const Tensor& grad,
                                         const Tensor& m, const Tensor& v, const AdamWArgs& args,
                                         const Tensor& param_copy))

}  // namespace moetron::kernels
