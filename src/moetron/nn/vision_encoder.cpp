#include "moetron/nn/vision_encoder.h"

#include <utility>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/embedding.h"
#include "moetron/nn/linear.h"

namespace moetron::nn {

namespace {

// Patches of images [B, C, H, W] (element type T) as rows of `out` (same type).
template <typename T>
void patchify(const Tensor& images, int64_t p, const Tensor& out) {
  const int64_t B = images.dim(0), C = images.dim(1), H = images.dim(2), W = images.dim(3);
  const int64_t rows = H / p, cols = W / p, width = C * p * p;
  const T* src = images.data<T>();
  T* dst = out.data<T>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        T* row = dst + ((b * rows + r) * cols + c) * width;
        for (int64_t ch = 0; ch < C; ++ch) {
          for (int64_t i = 0; i < p; ++i) {
            const T* line = src + ((b * C + ch) * H + r * p + i) * W + c * p;
            for (int64_t j = 0; j < p; ++j) row[(ch * p + i) * p + j] = line[j];
          }
        }
      }
    }
  }
}

}  // namespace

Tensor image_patches(const Tensor& images, int64_t patch) {
  MOETRON_CHECK(images.rank() == 4 && patch > 0 && images.dim(2) % patch == 0 &&
                    images.dim(3) % patch == 0 &&
                    (images.dtype() == DType::f32 || images.dtype() == DType::f64),
                "images must be f32 [B, C, H, W] with H and W multiples of the patch ", patch,
                ", got ", images.str());
  const int64_t n = images.dim(0) * (images.dim(2) / patch) * (images.dim(3) / patch);
  Tensor out = Tensor::empty({n, images.dim(1) * patch * patch}, images.dtype());
  if (images.dtype() == DType::f32) {
    patchify<float>(images, patch, out);
  } else {
    patchify<double>(images, patch, out);
  }
  return out;
}

VisionEncoder::VisionEncoder(const VisionConfig& cfg, int64_t d_lm, Precision prec,
                             ParameterSet& params, const std::string& root)
    : cfg_(cfg),
      prec_(prec),
      first_param_(params.all().size()),
      patch_embed_(&params.add(root + "patch_embed.weight",
                               {cfg.transformer.d_model, cfg.channels * cfg.patch * cfg.patch},
                               prec.compute, prec.accum, ParallelKind::replicated, InitKind::normal,
                               static_cast<float>(cfg.transformer.init_std), false)),
      pos_row_(&params.add(root + "pos_embed_row.weight", {cfg.max_rows, cfg.transformer.d_model},
                           prec.compute, prec.accum, ParallelKind::replicated, InitKind::normal,
                           static_cast<float>(cfg.transformer.init_std), false)),
      pos_col_(&params.add(root + "pos_embed_col.weight", {cfg.max_cols, cfg.transformer.d_model},
                           prec.compute, prec.accum, ParallelKind::replicated, InitKind::normal,
                           static_cast<float>(cfg.transformer.init_std), false)),
      trunk_(cfg.transformer, root, d_lm, prec, params) {
  MOETRON_CHECK(cfg.channels > 0 && cfg.patch > 0 && cfg.max_rows > 0 && cfg.max_cols > 0,
                "vision encoder: channels ", cfg.channels, ", patch ", cfg.patch, ", max_rows ",
                cfg.max_rows, " and max_cols ", cfg.max_cols, " must be positive");
  for (size_t i = first_param_; i < params.all().size(); ++i) own_.push_back(params.all()[i].get());
}

int64_t VisionEncoder::tokens_per_image(int64_t height, int64_t width) const {
  const int64_t p = cfg_.patch;
  MOETRON_CHECK(height > 0 && width > 0 && height % p == 0 && width % p == 0, "image of ", height,
                " x ", width, " pixels does not split into ", p, " x ", p, " patches");
  MOETRON_CHECK(height / p <= cfg_.max_rows && width / p <= cfg_.max_cols, "image of ", height,
                " x ", width, " pixels has ", height / p, " x ", width / p,
                " patches; the vision encoder's position tables hold ", cfg_.max_rows, " x ",
                cfg_.max_cols);
  return (height / p) * (width / p);
}

Tensor VisionEncoder::forward(kernels::Context& ctx, const Tensor& images) {
  MOETRON_CHECK(images.rank() == 4 && images.dim(1) == cfg_.channels &&
                    (images.dtype() == DType::f32 || images.dtype() == DType::f64),
                "vision encoder input must be f32 [B, ", cfg_.channels, ", H, W], got ",
                images.str());
  const int64_t b = images.dim(0), n = tokens_per_image(images.dim(2), images.dim(3));
  const int64_t t = b * n, p = cfg_.patch, d = cfg_.transformer.d_model;
  const Tensor raw = image_patches(images, p);
  patches_ = raw;
  if (raw.dtype() != prec_.compute) {
    patches_ = Tensor::empty(raw.shape(), prec_.compute);
    kernels::convert(ctx, raw, patches_);
  }
  row_ids_ = Tensor::empty({t}, DType::i32);
  col_ids_ = Tensor::empty({t}, DType::i32);
  const int64_t cols = images.dim(3) / p;
  for (int64_t i = 0; i < t; ++i) {
    row_ids_.data<int32_t>()[i] = static_cast<int32_t>((i % n) / cols);
    col_ids_.data<int32_t>()[i] = static_cast<int32_t>((i % n) % cols);
  }
  Tensor x = Tensor::empty({t, d}, prec_.compute);
  linear_forward(ctx, patches_, patch_embed_->value, x);
  Tensor pos = Tensor::empty({t, d}, prec_.compute);
  kernels::embedding_forward(ctx, row_ids_, pos_row_->value, pos, 0);
  kernels::add(ctx, x, pos, x);
  kernels::embedding_forward(ctx, col_ids_, pos_col_->value, pos, 0);
  kernels::add(ctx, x, pos, x);
  return trunk_.forward(ctx, x, b, n);
}

void VisionEncoder::backward(kernels::Context& ctx, const Tensor& d_tokens) {
  MOETRON_CHECK(patches_.defined(), "vision encoder backward without a saved forward");
  const Tensor d_x = trunk_.backward(ctx, d_tokens);
  kernels::embedding_backward(ctx, row_ids_, d_x, pos_row_->grad, 0);
  kernels::embedding_backward(ctx, col_ids_, d_x, pos_col_->grad, 0);
  linear_backward(ctx, d_x, patches_, patch_embed_->value, patch_embed_->grad, Tensor());
  release();
}

void VisionEncoder::release() {
  trunk_.release();
  patches_ = row_ids_ = col_ids_ = Tensor();
}

}  // namespace moetron::nn
