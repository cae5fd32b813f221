// The last step of an optimizer whose update is formed elsewhere (Muon's
// orthogonalised momentum): master = decay * master + alpha * update in one
// pass, stored in the master's dtype. A bf16 master
// (optim.master_dtype = "bf16") is stochastically rounded, element i with
// rounding_bits(key, i) (kernels/stochastic_round.h), so the decay and the
// small update survive in expectation.
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

// master: f32 or bf16 (reference also f64), any shape; update: f32 (or the
// master's dtype) of master's numel. Computed in fp32 (reference: in double,
// rounded to fp32 before the stochastic rounding, as the fp32 backends hold it).
MOETRON_KERNEL_DECL(void master_update(Context& ctx, const Tensor& master, float decay, float alpha,
                                       const Tensor& update, uint32_t key))

}  // namespace moetron::kernels
