// The projector from an encoder's width into the language model's (LLaVA-1.5):
// y = W2 gelu(W1 x), W1 [d_out, d_in], W2 [d_out, d_out], no biases (the
// encoder's final RMSNorm precedes it). Parameters `prefix` + "0.weight" and
// "2.weight" (a Sequential(Linear, GELU, Linear)'s names).
//
// Saves for backward: x, W1 x and its GELU.
#pragma once

#include <string>
#include <utility>

#include "moetron/kernels/context.h"
#include "moetron/nn/parameter.h"

namespace moetron::nn {

class Projector {
 public:
  Projector(int64_t d_in, int64_t d_out, const std::string& prefix, float init_std, Precision prec,
            ParameterSet& params);

  // x: [T, d_in] (compute dtype); returns y [T, d_out].
  Tensor forward(kernels::Context& ctx, const Tensor& x);
  // dx: [T, d_in] overwritten when defined; weight gradients accumulate.
  void backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx);
  void release() { saved_ = Saved{}; }

  struct Saved {
    Tensor x, pre, act;
  };

 private:
  int64_t d_in_, d_out_;
  Precision prec_;
  Parameter *w1_, *w2_;
  Saved saved_;
};

}  // namespace moetron::nn
