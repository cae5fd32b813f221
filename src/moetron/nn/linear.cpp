#include "moetron/nn/linear.h"

#include "moetron/kernels/matmul.h"

namespace moetron::nn {

void linear_forward(kernels::Context& ctx, const Tensor& x, const Tensor& w, const Tensor& y,
                    float beta) {
  kernels::MatmulArgs args;
  args.trans_b = true;
  args.beta = beta;
  kernels::matmul(ctx, x, w, y, args);
}

void linear_backward(kernels::Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                     const Tensor& dw, const Tensor& dx, float dx_beta) {
  kernels::MatmulArgs wgrad;
  wgrad.trans_a = true;
  wgrad.beta = 1.0f;
  kernels::matmul(ctx, dy, x, dw, wgrad);
  if (dx.defined()) {
    kernels::MatmulArgs dgrad;
    dgrad.beta = dx_beta;
    kernels::matmul(ctx, dy, w, dx, dgrad);
  }
}

Tensor as_matrix(const Tensor& t, int64_t cols) {
  MOETRON_CHECK(cols > 0 && t.numel() % cols == 0, "cannot view ", t.str(), " as rows of ", cols);
  return t.reshape({t.numel() / cols, cols});
}

}  // namespace moetron::nn
