#include "moetron/optim/newton_schulz.h"

#include <cmath>
#include <cstring>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"

namespace moetron::optim {

namespace {
// Writes the transpose of src [r, c] into dst [c, r] (any float dtype, same).
void transpose_into(const Tensor& src, const Tensor& dst) {
  const int64_t r = src.dim(0), c = src.dim(1);
  const size_t es = src.element_size();
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      std::memcpy(d + static_cast<size_t>(j * r + i) * es, s + static_cast<size_t>(i * c + j) * es,
                  es);
}
}  // namespace

void newton_schulz(kernels::Context& ctx, const Tensor& g, const Tensor& out, int steps) {
  MOETRON_CHECK(g.rank() == 2, "Newton-Schulz needs a matrix, got ", g.str());
  check_tensor(out, "newton_schulz out", g.shape(), g.dtype());
  const bool transpose = g.dim(0) > g.dim(1);
  const int64_t m = transpose ? g.dim(1) : g.dim(0), n = transpose ? g.dim(0) : g.dim(1);
  const DType dt = g.dtype();
  Tensor x = Tensor::empty({m, n}, dt, MemTag::workspace);
  if (transpose) {
    transpose_into(g, x);
  } else {
    x.copy_from(g);
  }
  const double norm = std::sqrt(kernels::sum_squares(ctx, x));
  kernels::scale(ctx, x, static_cast<float>(1.0 / (norm + 1e-7)), x);
  Tensor a = Tensor::empty({m, m}, dt, MemTag::workspace);
  Tensor b = Tensor::empty({m, m}, dt, MemTag::workspace);
  Tensor next = Tensor::empty({m, n}, dt, MemTag::workspace);
  for (int it = 0; it < steps; ++it) {
    kernels::MatmulArgs gram;
    gram.trans_b = true;
    kernels::matmul(ctx, x, x, a, gram);  // A = X X^T
    kernels::MatmulArgs sq;
    sq.alpha = kNsC;
    kernels::matmul(ctx, a, a, b, sq);  // B = c A^2
    kernels::axpy(ctx, kNsB, a, b);     // B += b A
    next.copy_from(x);
    kernels::MatmulArgs upd;
    upd.beta = kNsA;
    kernels::matmul(ctx, b, x, next, upd);  // X' = B X + a X
    std::swap(x, next);
  }
  if (transpose) {
    transpose_into(x, out);
  } else {
    out.copy_from(x);
  }
}

}  // namespace moetron::optim
