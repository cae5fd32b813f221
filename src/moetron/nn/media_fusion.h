// Media fusion: each media item of a multimodal micro-batch
// (nn/multimodal_batch.h) goes through its encoder and projector, once per
// forward, and its N tokens reach the language model
//  - as a prefix (LLaVA; multimodal.fusion "prefix" or "both"): they
//    replace the embeddings of positions [0, N) of its row, whose ids are
//    placeholders. Backward hands those rows' gradients to the encoders and
//    zeroes them, so the placeholder ids' embeddings get no gradient;
//  - for cross-attention (Flamingo; "cross_attention" or "both"): forward
//    returns them as MediaTokens (nn/cross_attention.h), which the caller
//    keeps until backward; backward takes their gradient summed over every
//    cross-attention layer (and adds the prefix rows' under "both").
//
// The encoders are recomputed in backward: forward keeps only the media
// inputs (which the batch holds anyway) and the projected tokens, and
// releases the encoders' activations at once, so any number of
// micro-batches may be in flight (pipeline parallelism) and no encoder
// activation lives through the language model's forward. The price is a
// second encoder forward per step.
//
// Tensor parallelism: the encoders are replicated over tp. Forward places
// the tokens in the rows this rank holds (a slice under sequence
// parallelism); backward takes the gradient of every row (the language
// model gathers it for the vocab-parallel embedding anyway), so every tp
// rank computes the same, complete encoder gradients.
#pragma once

#include <memory>
#include <vector>

#include "moetron/nn/audio_encoder.h"
#include "moetron/nn/cross_attention.h"
#include "moetron/nn/multimodal_batch.h"
#include "moetron/nn/multimodal_config.h"
#include "moetron/nn/tensor_parallel.h"
#include "moetron/nn/vision_encoder.h"

namespace moetron::nn {

// Tokens an item becomes, from the configuration alone (what
// MediaFusion::tokens_per_item says, for ranks that hold no encoder):
// an image of height x width pixels, an audio clip of `frames` frames.
int64_t image_tokens(const VisionConfig& cfg, int64_t height, int64_t width);
int64_t audio_tokens(const AudioConfig& cfg, int64_t frames);

class MediaFusion {
 public:
  // Adds both encoders' parameters to `params` (after the caller's).
  MediaFusion(const MultimodalModelConfig& cfg, int64_t d_lm, Precision prec, ParameterSet& params,
              const TensorParallel* tp);

  // Tokens one item of `group` (its input's trailing shape) becomes.
  int64_t tokens_per_item(const MediaGroup& group) const;
  int64_t tokens_per_item(Modality m, int64_t dim1, int64_t dim2) const;

  // x: the embeddings of the batch's B * S positions (under sequence
  // parallelism this rank's slice); with prefix fusion the media rows are
  // overwritten. Returns the tokens for cross-attention (M = the most
  // tokens of an item; undefined tokens without cross-attention fusion).
  MediaTokens forward(kernels::Context& ctx, const MultimodalBatch& mm, int64_t seq,
                      const Tensor& x);
  // d_x: the gradient wrt the embeddings of all B * S positions; d_media:
  // the gradient wrt forward's MediaTokens::tokens (undefined: none). Encoder
  // parameter gradients accumulate; with prefix fusion the media rows of d_x
  // are zeroed.
  void backward(kernels::Context& ctx, const MultimodalBatch& mm, int64_t seq, const Tensor& d_x,
                const Tensor& d_media = Tensor());
  bool prefix() const { return prefix_; }
  bool cross_attention() const { return cross_; }

  // The encoders' parameters, in the order they were added.
  const std::vector<Parameter*>& parameters() const { return params_; }

 private:
  const TensorParallel* tp_;
  int64_t d_lm_;
  bool prefix_, cross_;
  std::unique_ptr<VisionEncoder> vision_;
  std::unique_ptr<AudioEncoder> audio_;
  std::vector<Parameter*> params_;
  // Global rows [row0, row0 + rows) of B * S this rank's embeddings hold.
  std::pair<int64_t, int64_t> held_rows(int64_t total) const;
  // Every item's rows: calls f(local row of x, row of the encoder's tokens).
  template <typename F>
  void for_each_media_row(const MediaGroup& g, int64_t seq, int64_t row0, int64_t rows, F f) const;
  Tensor encode(kernels::Context& ctx, const MediaGroup& g);
  void check_group(const MediaGroup& g, int64_t batch, int64_t seq) const;
  // The cross-attention slots per row: the most tokens any item becomes.
  int64_t media_slots(const MultimodalBatch& mm) const;
};

}  // namespace moetron::nn
