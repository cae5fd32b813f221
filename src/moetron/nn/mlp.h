// Dense SwiGLU feed-forward: down(silu(gate(x)) * up(x)). gate and up are
// two parameters (Hugging Face names) stored as the halves of one [2F, D]
// buffer, so a single GEMM computes both.
//
// Saves for backward: the input x, the gate-up product [T, 2F] and the
// SwiGLU output [T, F]. Recomputation (nn/recompute.h): moe_act drops the
// SwiGLU output (rebuilt from the gate-up product in backward); norm drops
// x, which the caller hands back through restore_input before backward.
//
// Tensor parallelism (nn/tensor_parallel.h): gate and up column-parallel,
// down row-parallel, F / tp hidden units per rank; x, y are token slices
// under sequence parallelism.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moetron/kernels/context.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/tensor_parallel.h"
#include "moetron/nn/tensor_parallel_2d.h"

namespace moetron::nn {

class SwiGluMlp {
 public:
  // Parameters `prefix` + gate_proj.weight, up_proj.weight, down_proj.weight.
  SwiGluMlp(int64_t d_model, int64_t hidden, const std::string& prefix, float init_std,
            float out_std, Precision prec, ParameterSet& params,
            const TensorParallel* tp = nullptr);

  // x: [T, D]; y: [T, D] = mlp(x) + beta * y (beta = 0 under tensor parallelism).
  void forward(kernels::Context& ctx, const Tensor& x, const Tensor& y, float beta = 0.0f);
  // dx = grad wrt x + dx_beta * dx.
  void backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx, float dx_beta = 0.0f);
  void release() { saved_ = Saved{}; }
  void set_drop_act(bool drop) { drop_act_ = drop; }
  void drop_input() { saved_.x = Tensor(); }
  void restore_input(const Tensor& x) { saved_.x = column_parallel_input(*tp_, x); }
  // Under a 2-D grid: the weights gathered along the grid column for use
  // (the fused gate-up buffer as two parts, so gate rows stay first).
  std::vector<GridSlot> grid_slots();

 private:
  const TensorParallel* tp_;
  int64_t d_, f_;  // f_: this rank's hidden units
  Precision prec_;
  // [2F, D]: rows [0, F) gate, [F, 2F) up (the stored grid block [2F / R, D]
  // between uses under a 2-D grid: its gate rows, then its up rows).
  Tensor w13_, w13_grad_;
  Parameter* down_;
  bool drop_act_ = false;

 public:
  // What forward saved for backward. Pipeline parallelism keeps several
  // micro-batches in flight and swaps each one's in and out.
  struct Saved {
    Tensor x, gate_up, act;
  };
  void swap_saved(Saved& other) { std::swap(saved_, other); }

 private:
  Saved saved_;
};

}  // namespace moetron::nn
