#include "moetron/nn/media_fusion.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/kernels/elementwise.h"

namespace moetron::nn {

int64_t image_tokens(const VisionConfig& cfg, int64_t height, int64_t width) {
  MOETRON_CHECK(height > 0 && width > 0 && height % cfg.patch == 0 && width % cfg.patch == 0,
                "an image of ", height, " x ", width, " pixels does not split into ", cfg.patch,
                " x ", cfg.patch, " patches (vision.patch)");
  return (height / cfg.patch) * (width / cfg.patch);
}

int64_t audio_tokens(const AudioConfig& cfg, int64_t frames) {
  const int64_t k = cfg.conv_kernel;
  const int64_t after_first = kernels::conv1d_output_length(frames, k, {cfg.conv1_stride, k / 2});
  return kernels::conv1d_output_length(after_first, k, {cfg.conv2_stride, k / 2});
}

MediaFusion::MediaFusion(const MultimodalModelConfig& cfg, int64_t d_lm, Precision prec,
                         ParameterSet& params, const TensorParallel* tp)
    : tp_(tp ? tp : &no_tensor_parallel()),
      d_lm_(d_lm),
      prefix_(cfg.prefix_fusion()),
      cross_(cfg.cross_attention()) {
  MOETRON_CHECK(prefix_ || cross_,
                "multimodal.fusion must be prefix, cross_attention or both, got '", cfg.fusion,
                "'");
  const size_t first = params.all().size();
  vision_ = std::make_unique<VisionEncoder>(cfg.vision, d_lm, prec, params);
  audio_ = std::make_unique<AudioEncoder>(cfg.audio, d_lm, prec, params);
  for (size_t i = first; i < params.all().size(); ++i) params_.push_back(params.all()[i].get());
}

int64_t MediaFusion::tokens_per_item(Modality m, int64_t dim1, int64_t dim2) const {
  switch (m) {
    case Modality::image:
      return vision_->tokens_per_image(dim1, dim2);
    case Modality::audio:
      MOETRON_CHECK(dim2 == audio_->config().n_mels, "audio features of ", dim2,
                    " mel bins, the encoder takes audio.n_mels = ", audio_->config().n_mels);
      return audio_->tokens_for_frames(dim1);
    case Modality::text:
      break;
  }
  MOETRON_FAIL("text is not a media modality");
}

int64_t MediaFusion::tokens_per_item(const MediaGroup& g) const {
  const Tensor& in = g.input;
  if (g.modality == Modality::image) {
    MOETRON_CHECK(in.rank() == 4, "images must be [n, C, H, W], got ", in.str());
    return tokens_per_item(g.modality, in.dim(2), in.dim(3));
  }
  MOETRON_CHECK(in.rank() == 3, "audio features must be [n, frames, n_mels], got ", in.str());
  return tokens_per_item(g.modality, in.dim(1), in.dim(2));
}

void MediaFusion::check_group(const MediaGroup& g, int64_t batch, int64_t seq) const {
  MOETRON_CHECK(g.input.defined() && g.input.dim(0) == static_cast<int64_t>(g.rows.size()),
                "a media group of ", g.rows.size(), " rows but input ",
                g.input.defined() ? g.input.str() : std::string("undefined"));
  const int64_t n = tokens_per_item(g);
  MOETRON_CHECK(!prefix_ || n <= seq, "a media item of ", n, " tokens does not fit a sequence of ",
                seq);
  for (int64_t r : g.rows)
    MOETRON_CHECK(r >= 0 && r < batch, "media row ", r, " outside the batch's ", batch, " rows");
}

std::pair<int64_t, int64_t> MediaFusion::held_rows(int64_t total) const {
  if (!tp_->sequence_parallel) return {0, total};
  const int64_t rows = tp_->slice_rows(total);
  return {tp_->rank * rows, rows};
}

template <typename F>
void MediaFusion::for_each_media_row(const MediaGroup& g, int64_t seq, int64_t row0, int64_t rows,
                                     F f) const {
  const int64_t n = tokens_per_item(g);
  for (size_t i = 0; i < g.rows.size(); ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t local = g.rows[i] * seq + j - row0;
      if (local >= 0 && local < rows) f(local, static_cast<int64_t>(i) * n + j);
    }
  }
}

Tensor MediaFusion::encode(kernels::Context& ctx, const MediaGroup& g) {
  return g.modality == Modality::image ? vision_->forward(ctx, g.input)
                                       : audio_->forward(ctx, g.input);
}

int64_t MediaFusion::media_slots(const MultimodalBatch& mm) const {
  int64_t m = 0;
  for (const MediaGroup& g : mm.media) m = std::max(m, tokens_per_item(g));
  return m;
}

MediaTokens MediaFusion::forward(kernels::Context& ctx, const MultimodalBatch& mm, int64_t seq,
                                 const Tensor& x) {
  const auto batch = static_cast<int64_t>(mm.row_task.size());
  const auto [row0, rows] = held_rows(batch * seq);
  MOETRON_CHECK(x.dim(0) == rows && x.dim(1) == d_lm_, "embeddings ", x.str(), " for ", rows,
                " rows of width ", d_lm_);
  MediaTokens cross;
  const int64_t m = cross_ ? media_slots(mm) : 0;
  if (m > 0) {
    cross.tokens = Tensor::zeros({batch * m, d_lm_}, x.dtype());
    cross.lengths.assign(static_cast<size_t>(batch), 0);
  }
  for (const MediaGroup& g : mm.media) {
    check_group(g, batch, seq);
    const Tensor tokens = encode(ctx, g);
    // Released at once: backward encodes again (see the header).
    (g.modality == Modality::image ? vision_->release() : audio_->release());
    if (prefix_) {
      for_each_media_row(g, seq, row0, rows,
                         [&](int64_t local, int64_t t) { x[local].copy_from(tokens[t]); });
    }
    if (m == 0) continue;
    const int64_t n = tokens_per_item(g);
    for (size_t i = 0; i < g.rows.size(); ++i) {
      const int64_t r = g.rows[i], first = static_cast<int64_t>(i) * n;
      cross.tokens.slice(r * m, r * m + n).copy_from(tokens.slice(first, first + n));
      cross.lengths[static_cast<size_t>(r)] = n;
    }
  }
  return cross;
}

void MediaFusion::backward(kernels::Context& ctx, const MultimodalBatch& mm, int64_t seq,
                           const Tensor& d_x, const Tensor& d_media) {
  const auto batch = static_cast<int64_t>(mm.row_task.size());
  const int64_t rows = batch * seq;
  MOETRON_CHECK(!prefix_ || d_x.dim(0) == rows, "embedding gradient ", d_x.str(), " for ", rows,
                " rows");
  const int64_t m = d_media.defined() ? d_media.dim(0) / batch : 0;
  for (const MediaGroup& g : mm.media) {
    const Tensor tokens = encode(ctx, g);  // saves what the encoder's backward needs
    const Tensor d_tokens = prefix_ ? Tensor::empty(tokens.shape(), tokens.dtype())
                                    : Tensor::zeros(tokens.shape(), tokens.dtype());
    if (prefix_) {
      for_each_media_row(g, seq, 0, rows, [&](int64_t local, int64_t t) {
        d_tokens[t].copy_from(d_x[local]);
        d_x[local].fill(0.0);
      });
    }
    const int64_t n = tokens_per_item(g);
    for (size_t i = 0; i < g.rows.size() && m > 0; ++i) {
      const int64_t r = g.rows[i], first = static_cast<int64_t>(i) * n;
      const Tensor d_item = d_tokens.slice(first, first + n);
      kernels::add(ctx, d_item, d_media.slice(r * m, r * m + n), d_item);
    }
    if (g.modality == Modality::image) {
      vision_->backward(ctx, d_tokens);
      vision_->release();
    } else {
      audio_->backward(ctx, d_tokens);
      audio_->release();
    }
  }
}

}  // namespace moetron::nn
