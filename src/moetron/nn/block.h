// One pre-norm decoder block: h = x + attn(norm1(x)); out = h + ffn(norm2(h)),
// the FFN dense SwiGLU or routed MoE by configuration.
//
// Saves for backward: x, h, both norms' 1/rms; the modules save their own inputs
// (the norm outputs).
#pragma once

#include <memory>
#include <string>

#include "moetron/nn/attention.h"
#include "moetron/nn/mlp.h"
#include "moetron/nn/moe.h"

namespace moetron::nn {

class Block {
 public:
  Block(const ModelConfig& model, const MoeConfig& moe, int64_t index, Precision prec,
        ParameterSet& params);

  // x: [B*S, D]; returns the block's output [B*S, D] (a new tensor).
  Tensor forward(kernels::Context& ctx, const Tensor& x, const Tensor& positions, int64_t batch,
                 int64_t seq, double loss_weight, MoeStats& moe_stats);
  // Returns the gradient wrt x.
  Tensor backward(kernels::Context& ctx, const Tensor& d_out);
  void release();
  MoeLayer* moe() { return moe_.get(); }

 private:
  int64_t d_;
  float eps_;
  Precision prec_;
  Parameter *norm1_, *norm2_;
  SelfAttention attn_;
  std::unique_ptr<SwiGluMlp> mlp_;
  std::unique_ptr<MoeLayer> moe_;
  struct Saved {
    Tensor x, h, rstd1, rstd2;
  } saved_;
};

}  // namespace moetron::nn
