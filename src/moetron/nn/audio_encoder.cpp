#include "moetron/nn/audio_encoder.h"

#include <cmath>
#include <utility>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/gelu.h"

namespace moetron::nn {

AudioEncoder::AudioEncoder(const AudioConfig& cfg, int64_t d_lm, Precision prec,
                           ParameterSet& params, const std::string& root)
    : cfg_(cfg),
      prec_(prec),
      first_param_(params.all().size()),
      conv1_{cfg.conv1_stride, cfg.conv_kernel / 2},
      conv2_{cfg.conv2_stride, cfg.conv_kernel / 2},
      trunk_(cfg.transformer, root, d_lm, prec, params) {
  const int64_t d = cfg.transformer.d_model, k = cfg.conv_kernel;
  MOETRON_CHECK(cfg.n_mels > 0 && k > 0 && cfg.conv1_stride > 0 && cfg.conv2_stride > 0,
                "audio encoder: n_mels ", cfg.n_mels, ", conv_kernel ", k, " and strides ",
                cfg.conv1_stride, ", ", cfg.conv2_stride, " must be positive");
  MOETRON_CHECK(d % 2 == 0, "audio encoder: d_model ", d,
                " must be even (sinusoidal positions: sin and cos halves)");
  const auto std = static_cast<float>(cfg.transformer.init_std);
  // 3-D convolution weights: not hidden matrices (Muon orthogonalises 2-D ones).
  const auto add = [&](const char* name, const Shape& shape, InitKind init) {
    return &params.add(root + name, shape, prec.compute, prec.accum, ParallelKind::replicated, init,
                       std, false);
  };
  w1_ = add("conv1.weight", {d, cfg.n_mels, k}, InitKind::normal);
  b1_ = add("conv1.bias", {d}, InitKind::zeros);
  w2_ = add("conv2.weight", {d, d, k}, InitKind::normal);
  b2_ = add("conv2.bias", {d}, InitKind::zeros);
  for (size_t i = first_param_; i < params.all().size(); ++i) own_.push_back(params.all()[i].get());
}

int64_t AudioEncoder::tokens_for_frames(int64_t frames) const {
  const int64_t k = cfg_.conv_kernel;
  return kernels::conv1d_output_length(kernels::conv1d_output_length(frames, k, conv1_), k, conv2_);
}

Tensor AudioEncoder::positions(kernels::Context& ctx, int64_t batch, int64_t tokens) const {
  const int64_t d = cfg_.transformer.d_model, half = d / 2;
  // Angles in double, stored in f64 for an f64 model, else f32 (then converted).
  const DType host = prec_.compute == DType::f64 ? DType::f64 : DType::f32;
  Tensor table = Tensor::empty({batch * tokens, d}, host, MemTag::workspace);
  const double step = half > 1 ? std::log(10000.0) / static_cast<double>(half - 1) : 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * std::exp(-step * static_cast<double>(i));
      if (host == DType::f64) {
        table.data<double>()[t * d + i] = std::sin(angle);
        table.data<double>()[t * d + half + i] = std::cos(angle);
      } else {
        table.data<float>()[t * d + i] = static_cast<float>(std::sin(angle));
        table.data<float>()[t * d + half + i] = static_cast<float>(std::cos(angle));
      }
    }
  }
  for (int64_t b = 1; b < batch; ++b)
    table.slice(b * tokens, (b + 1) * tokens).copy_from(table.slice(0, tokens));
  if (prec_.compute == host) return table;
  Tensor out = Tensor::empty(table.shape(), prec_.compute);
  kernels::convert(ctx, table, out);
  return out;
}

Tensor AudioEncoder::forward(kernels::Context& ctx, const Tensor& mel) {
  MOETRON_CHECK(mel.rank() == 3 && mel.dim(2) == cfg_.n_mels &&
                    (mel.dtype() == DType::f32 || mel.dtype() == DType::f64),
                "audio encoder input must be f32 log-mel frames [B, T, ", cfg_.n_mels, "], got ",
                mel.str());
  const int64_t b = mel.dim(0), d = cfg_.transformer.d_model, k = cfg_.conv_kernel;
  const int64_t t1 = kernels::conv1d_output_length(mel.dim(1), k, conv1_);
  const int64_t n = kernels::conv1d_output_length(t1, k, conv2_);
  mel_ = mel;
  if (mel.dtype() != prec_.compute) {
    mel_ = Tensor::empty(mel.shape(), prec_.compute);
    kernels::convert(ctx, mel, mel_);
  }
  pre1_ = Tensor::empty({b, t1, d}, prec_.compute);
  kernels::conv1d_forward(ctx, mel_, w1_->value, b1_->value, conv1_, pre1_);
  act1_ = Tensor::empty({b, t1, d}, prec_.compute);
  kernels::gelu_forward(ctx, pre1_, act1_);
  pre2_ = Tensor::empty({b, n, d}, prec_.compute);
  kernels::conv1d_forward(ctx, act1_, w2_->value, b2_->value, conv2_, pre2_);
  Tensor x = Tensor::empty({b * n, d}, prec_.compute);
  kernels::gelu_forward(ctx, pre2_.reshape({b * n, d}), x);
  kernels::add(ctx, x, positions(ctx, b, n), x);
  return trunk_.forward(ctx, x, b, n);
}

void AudioEncoder::backward(kernels::Context& ctx, const Tensor& d_tokens) {
  MOETRON_CHECK(pre2_.defined(), "audio encoder backward without a saved forward");
  Tensor d_pre2 = trunk_.backward(ctx, d_tokens).reshape(pre2_.shape());
  kernels::gelu_backward(ctx, d_pre2, pre2_, d_pre2);
  Tensor d_act1 = Tensor::empty(act1_.shape(), prec_.compute);
  kernels::conv1d_backward(ctx, d_pre2, act1_, w2_->value, conv2_, d_act1, w2_->grad, b2_->grad);
  kernels::gelu_backward(ctx, d_act1, pre1_, d_act1);
  kernels::conv1d_backward(ctx, d_act1, mel_, w1_->value, conv1_, Tensor(), w1_->grad, b1_->grad);
  release();
}

void AudioEncoder::release() {
  trunk_.release();
  mel_ = pre1_ = act1_ = pre2_ = Tensor();
}

}  // namespace moetron::nn
