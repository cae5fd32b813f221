#include "moetron/nn/mlp.h"

#include "moetron/kernels/activation.h"
#include "moetron/nn/linear.h"

namespace moetron::nn {

SwiGluMlp::SwiGluMlp(int64_t d_model, int64_t hidden, const std::string& prefix, float init_std,
                     float out_std, Precision prec, ParameterSet& params)
    : d_(d_model), f_(hidden), prec_(prec) {
  w13_ = Tensor::empty({2 * f_, d_}, prec.compute, MemTag::params);
  w13_grad_ = Tensor::zeros({2 * f_, d_}, prec.accum, MemTag::grads);
  params.add_view(prefix + "gate_proj.weight", w13_.slice(0, f_), w13_grad_.slice(0, f_),
                           ParallelKind::column, InitKind::normal, init_std, true);
  params.add_view(prefix + "up_proj.weight", w13_.slice(f_, 2 * f_),
                         w13_grad_.slice(f_, 2 * f_), ParallelKind::column, InitKind::normal,
                         init_std, true);
  down_ = &params.add(prefix + "down_proj.weight", {d_, f_}, prec.compute, prec.accum,
                      ParallelKind::row, InitKind::normal, out_std, true);
}

void SwiGluMlp::forward(kernels::Context& ctx, const Tensor& x, const Tensor& y, float beta) {
  const int64_t t = x.dim(0);
  Saved s;
  s.x = x;
  s.gate_up = Tensor::empty({t, 2 * f_}, prec_.compute);
  linear_forward(ctx, x, w13_, s.gate_up);
  s.act = Tensor::empty({t, f_}, prec_.compute);
  kernels::swiglu_forward(ctx, s.gate_up, s.act);
  linear_forward(ctx, s.act, down_->value, y, beta);
  if (drop_act_) s.act = Tensor();
  saved_ = std::move(s);
}

void SwiGluMlp::backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx, float dx_beta) {
  Saved& s = saved_;
  MOETRON_CHECK(s.x.defined() && s.gate_up.defined(), "MLP backward without a saved forward");
  const int64_t t = s.x.dim(0);
  if (!s.act.defined()) {  // moe_act recompute
    s.act = Tensor::empty({t, f_}, prec_.compute);
    kernels::swiglu_forward(ctx, s.gate_up, s.act);
  }
  Tensor d_act = Tensor::empty({t, f_}, prec_.compute);
  linear_backward(ctx, dy, s.act, down_->value, down_->grad, d_act);
  Tensor d_gate_up = Tensor::empty({t, 2 * f_}, prec_.compute);
  kernels::swiglu_backward(ctx, d_act, s.gate_up, d_gate_up);
  linear_backward(ctx, d_gate_up, s.x, w13_, w13_grad_, dx, dx_beta);
  release();
}

}  // namespace moetron::nn
