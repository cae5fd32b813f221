#include "moetron/nn/encoder_trunk.h"

#include <utility>

#include "moetron/kernels/norm.h"

namespace moetron::nn {

namespace {
std::unique_ptr<Block> encoder_block(const EncoderTransformerConfig& cfg, const std::string& root,
                                     int64_t index, Precision prec, ParameterSet& params) {
  MoeConfig dense;
  dense.num_experts = 0;
  BlockOptions options;
  options.layers_prefix = root + "layers.";
  options.causal = false;
  options.rope = false;
  return std::make_unique<Block>(encoder_block_config(cfg), dense, index, prec, params,
                                 ExpertParallel{}, nullptr, options);
}
}  // namespace

EncoderTrunk::EncoderTrunk(const EncoderTransformerConfig& cfg, const std::string& root,
                           int64_t d_lm, Precision prec, ParameterSet& params)
    : d_(cfg.d_model),
      eps_(static_cast<float>(cfg.norm_eps)),
      prec_(prec),
      norm_(nullptr),
      projector_(cfg.d_model, d_lm, root + "projector.", static_cast<float>(cfg.init_std), prec,
                 params) {
  MOETRON_CHECK(cfg.d_model > 0 && cfg.n_heads > 0 && cfg.d_model % cfg.n_heads == 0 &&
                    cfg.n_layers >= 0 && cfg.ffn_hidden > 0,
                root, "encoder: d_model ", cfg.d_model, " must be a positive multiple of n_heads ",
                cfg.n_heads, ", ffn_hidden > 0 and n_layers >= 0");
  for (int64_t i = 0; i < cfg.n_layers; ++i)
    blocks_.push_back(encoder_block(cfg, root, i, prec, params));
  norm_ = &params.add(root + "norm.weight", {cfg.d_model}, prec.accum, prec.accum,
                      ParallelKind::replicated, InitKind::ones, 0, false);
}

Tensor EncoderTrunk::forward(kernels::Context& ctx, const Tensor& x_in, int64_t batch,
                             int64_t tokens) {
  check_shape(x_in, "encoder tokens", {batch * tokens, d_});
  Tensor positions = Tensor::empty({batch * tokens}, DType::i32);
  for (int64_t i = 0; i < batch * tokens; ++i)
    positions.data<int32_t>()[i] = static_cast<int32_t>(i % tokens);
  Tensor x = x_in;
  MoeStats unused;  // dense blocks
  for (auto& blk : blocks_) x = blk->forward(ctx, x, positions, batch, tokens, 0.0, unused);
  rstd_ = Tensor::empty({batch * tokens}, prec_.accum);
  Tensor h = Tensor::empty({batch * tokens, d_}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, norm_->value, eps_, h, rstd_);
  x_final_ = x;
  return projector_.forward(ctx, h);
}

Tensor EncoderTrunk::backward(kernels::Context& ctx, const Tensor& d_out) {
  MOETRON_CHECK(x_final_.defined(), "encoder backward without a saved forward");
  const int64_t t = x_final_.dim(0);
  Tensor d_h = Tensor::empty({t, d_}, prec_.compute);
  projector_.backward(ctx, d_out, d_h);
  Tensor d_x = Tensor::empty({t, d_}, prec_.compute);
  kernels::rmsnorm_backward(ctx, d_h, x_final_, norm_->value, rstd_, d_x, norm_->grad);
  x_final_ = rstd_ = Tensor();
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) d_x = (*it)->backward(ctx, d_x);
  return d_x;
}

void EncoderTrunk::release() {
  for (auto& blk : blocks_) blk->release();
  projector_.release();
  x_final_ = rstd_ = Tensor();
}

}  // namespace moetron::nn
