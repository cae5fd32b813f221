// Muon's orthogonalisation: the Newton-Schulz quintic iteration (Keller
// Jordan's coefficients) that maps G = U S V^T to approximately U V^T.
#pragma once

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"

namespace moetron::optim {

inline constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;

// out = NS(g) for a 2-D g [rows, cols] (f32, or f64 on the reference
// backend): X = g / (||g||_F + 1e-7), transposed when rows > cols so the
// X X^T Gram matrix is the small one, `steps` times
// A = X X^T; B = b A + c A^2; X = a X + B X.
// The singular values of the result lie in roughly [0.68, 1.13] (the quintic
// trades exactness for speed), not exactly 1.
void newton_schulz(kernels::Context& ctx, const Tensor& g, const Tensor& out, int steps = 5);

}  // namespace moetron::optim
