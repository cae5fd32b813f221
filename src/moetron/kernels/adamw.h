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
};

// g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// master -= lr * (wd * master + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)).
// master: f32 [n] (reference also f64); m, v: [n], both f32 or both bf16
// (reference: the master's dtype or bf16) — bf16 moments are loaded into
// fp32, updated, used for the update, then stored rounded to nearest even;
// grad: f32 or bf16 [n];
// param_copy: undefined, or [n] f32/bf16 receiving the updated master (the working copy).
MOETRON_KERNEL_DECL_CUDA(void adamw_step(Context& ctx, const Tensor& master, const Tensor& grad,
                                         const Tensor& m, const Tensor& v, const AdamWArgs& args,
                                         const Tensor& param_copy))

}  // namespace moetron::kernels
