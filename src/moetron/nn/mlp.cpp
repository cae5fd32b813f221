#include "moetron/nn/mlp.h"

#include <utility>

#include "moetron/kernels/activation.h"
#include "moetron/nn/linear.h"
#include "moetron/nn/recompute.h"
#include "moetron/nn/tensor_parallel_2d.h"

namespace moetron::nn {

SwiGluMlp::SwiGluMlp(int64_t d_model, int64_t hidden, const std::string& prefix, float init_std,
                     float out_std, Precision prec, ParameterSet& params, const TensorParallel* tp)
    : tp_(tp ? tp : &no_tensor_parallel()), d_(d_model), f_(hidden / tp_->size), prec_(prec) {
  MOETRON_CHECK(hidden % tp_->size == 0, prefix, ": ", hidden,
                " hidden units do not divide over parallel.tp = ", tp_->size);
  // Under a 2-D grid this rank stores its grid row's block of the gate's
  // rows and of the up rows (nn/tensor_parallel_2d.h), gathered for use.
  const int64_t rows = tp_->grid() ? grid_block_rows(*tp_, f_, prefix + "gate_proj.weight") : f_;
  w13_ = Tensor::empty({2 * rows, d_}, prec.compute, MemTag::params);
  w13_grad_ = Tensor::zeros({2 * rows, d_}, prec.matrix_grad(), MemTag::grads);
  Parameter& gate =
      params.add_view(prefix + "gate_proj.weight", w13_.slice(0, rows), w13_grad_.slice(0, rows),
                      ParallelKind::column, InitKind::normal, init_std, true);
  Parameter& up = params.add_view(prefix + "up_proj.weight", w13_.slice(rows, 2 * rows),
                                  w13_grad_.slice(rows, 2 * rows), ParallelKind::column,
                                  InitKind::normal, init_std, true);
  down_ = &params.add(prefix + "down_proj.weight", {d_, f_}, prec.compute, prec.matrix_grad(),
                      ParallelKind::row, InitKind::normal, out_std, true);
  if (tp_->on()) {
    const int64_t first = tp_->rank * f_ + tp_->grid_row * (tp_->grid() ? rows : 0);
    ParameterSet::set_shard(gate, {hidden, d_}, first, 0);
    ParameterSet::set_shard(up, {hidden, d_}, first, 0);
    ParameterSet::set_shard(*down_, {d_, hidden}, 0, tp_->rank * f_);
    split_over_grid_column(*tp_, *down_);
  }
}

std::vector<GridSlot> SwiGluMlp::grid_slots() {
  const int64_t rows = w13_.dim(0) / 2;  // the stored block's gate rows
  return {GridSlot{&w13_, &w13_grad_, {{0, rows}, {rows, rows}}}, grid_slot(*down_)};
}

void SwiGluMlp::forward(kernels::Context& ctx, const Tensor& x_given, const Tensor& y, float beta) {
  MOETRON_CHECK(beta == 0.0f || !tp_->on(),
                "a tensor-parallel MLP overwrites its output (beta = 0)");
  const Tensor x = column_parallel_input(*tp_, x_given);
  const int64_t t = x.dim(0);
  Saved s;
  s.x = x;
  s.gate_up = Tensor::empty({t, 2 * f_}, prec_.compute);
  linear_forward(ctx, x, w13_, s.gate_up);
  s.act = Tensor::empty({t, f_}, prec_.compute);
  kernels::swiglu_forward(ctx, s.gate_up, s.act);
  const Tensor partial = tp_->sequence_parallel ? Tensor::empty({t, d_}, prec_.compute) : y;
  linear_forward(ctx, s.act, down_->value, partial, beta);
  if (tp_->on()) {
    const Tensor done = finish_row_parallel(*tp_, partial);
    if (done.raw() != y.raw()) y.copy_from(done);
  }
  if (drop_act_) s.act = Tensor();
  saved_ = std::move(s);
}

void SwiGluMlp::backward(kernels::Context& ctx, const Tensor& dy_given, const Tensor& dx,
                         float dx_beta) {
  MOETRON_CHECK(dx_beta == 0.0f || !tp_->on(),
                "a tensor-parallel MLP overwrites its input gradient");
  const Tensor dy = column_parallel_input(*tp_, dy_given);
  Saved& s = saved_;
  MOETRON_CHECK(s.x.defined() && s.gate_up.defined(), "MLP backward without a saved forward");
  const int64_t t = s.x.dim(0);
  if (!s.act.defined()) {  // moe_act recompute
    const RecomputeTimer timer;
    s.act = Tensor::empty({t, f_}, prec_.compute);
    kernels::swiglu_forward(ctx, s.gate_up, s.act);
  }
  Tensor d_act = Tensor::empty({t, f_}, prec_.compute);
  linear_backward(ctx, dy, s.act, down_->value, down_->grad, d_act);
  s.act = Tensor();
  // In place: each element's gradient replaces the gate-up value it needed.
  Tensor d_gate_up = std::exchange(s.gate_up, Tensor());
  kernels::swiglu_backward(ctx, d_act, d_gate_up, d_gate_up);
  d_act = Tensor();
  const Tensor dx_partial = tp_->sequence_parallel ? Tensor::empty({t, d_}, prec_.compute) : dx;
  linear_backward(ctx, d_gate_up, s.x, w13_, w13_grad_, dx_partial, dx_beta);
  if (tp_->on()) {
    const Tensor done = finish_row_parallel(*tp_, dx_partial);
    if (done.raw() != dx.raw()) dx.copy_from(done);
  }
  release();
}

}  // namespace moetron::nn
