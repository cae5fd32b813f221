#include "moetron/nn/projector.h"

#include "moetron/kernels/gelu.h"
#include "moetron/nn/linear.h"

namespace moetron::nn {

Projector::Projector(int64_t d_in, int64_t d_out, const std::string& prefix, float init_std,
                     Precision prec, ParameterSet& params)
    : d_in_(d_in), d_out_(d_out), prec_(prec) {
  w1_ = &params.add(prefix + "0.weight", {d_out, d_in}, prec.compute, prec.matrix_grad(),
                    ParallelKind::replicated, InitKind::normal, init_std, true);
  w2_ = &params.add(prefix + "2.weight", {d_out, d_out}, prec.compute, prec.matrix_grad(),
                    ParallelKind::replicated, InitKind::normal, init_std, true);
}

Tensor Projector::forward(kernels::Context& ctx, const Tensor& x) {
  check_shape(x, "projector input", {x.dim(0), d_in_});
  const int64_t t = x.dim(0);
  Saved s;
  s.x = x;
  s.pre = Tensor::empty({t, d_out_}, prec_.compute);
  linear_forward(ctx, x, w1_->value, s.pre);
  s.act = Tensor::empty({t, d_out_}, prec_.compute);
  kernels::gelu_forward(ctx, s.pre, s.act);
  Tensor y = Tensor::empty({t, d_out_}, prec_.compute);
  linear_forward(ctx, s.act, w2_->value, y);
  saved_ = std::move(s);
  return y;
}

void Projector::backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx) {
  Saved& s = saved_;
  MOETRON_CHECK(s.x.defined(), "projector backward without a saved forward");
  const int64_t t = s.x.dim(0);
  Tensor d_act = Tensor::empty({t, d_out_}, prec_.compute);
  linear_backward(ctx, dy, s.act, w2_->value, w2_->grad, d_act);
  kernels::gelu_backward(ctx, d_act, s.pre, d_act);
  linear_backward(ctx, d_act, s.x, w1_->value, w1_->grad, dx);
  release();
}

}  // namespace moetron::nn
