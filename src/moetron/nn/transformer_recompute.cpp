// The Transformer's blocks under a recompute policy (nn/recompute.h).
//
// With segments of k blocks, forward keeps the input of each segment's first
// block and releases everything the blocks saved, except in the last segment
// (backward needs it first). Backward walks the segments from the last: a
// released segment is run forward again from its checkpoint (the same
// kernels on the same input, so the same activations and the same routing,
// which each MoE layer checks), then backward through its blocks.
#include "moetron/nn/transformer.h"

namespace moetron::nn {

void Transformer::set_recompute(const RecomputePolicy& policy) {
  MOETRON_CHECK(policy.segment >= 0, "recompute segment must be >= 0, got ", policy.segment);
  recompute_ = policy;
  // Segments never cross a pipeline chunk: each chunk is checkpointed on its own.
  for (const auto& [begin, end] : chunks_) {
    const size_t last = last_segment_start(begin, end);
    for (size_t i = begin; i < end; ++i) {
      blocks_[i]->set_recompute(policy.modules);
      blocks_[i]->set_checkpointed(i < last);
    }
  }
}

size_t Transformer::last_segment_start(size_t begin, size_t end) const {
  const auto n = static_cast<int64_t>(end - begin);
  const int64_t k = recompute_.segment;
  return begin + static_cast<size_t>(k > 0 && n > 0 ? (n - 1) / k * k : 0);
}

int64_t Transformer::last_segment_start() const {
  return static_cast<int64_t>(last_segment_start(0, blocks_.size()));
}

void Transformer::release_checkpoints() {
  ckpt_ = Checkpoints{};
}

Tensor Transformer::forward_blocks(kernels::Context& ctx, Tensor x, const Tensor& positions,
                                   int64_t batch, int64_t seq, double loss_weight, MoeStats& stats,
                                   const MediaTokens* media) {
  release_checkpoints();
  ckpt_.batch = batch;
  ckpt_.seq = seq;
  ckpt_.loss_weight = loss_weight;
  const int64_t k = recompute_.segment, last = last_segment_start();
  for (int64_t i = 0; i < static_cast<int64_t>(blocks_.size()); ++i) {
    Block& blk = *blocks_[static_cast<size_t>(i)];
    if (k > 0 && i < last && i % k == 0) ckpt_.inputs.push_back(x);
    need_block(static_cast<size_t>(i));
    x = blk.forward(ctx, x, positions, batch, seq, loss_weight, stats, media);
    if (i < last) blk.release();
  }
  return x;
}

Tensor Transformer::backward_blocks(kernels::Context& ctx, Tensor d_x, const Tensor& d_media) {
  const auto n = static_cast<int64_t>(blocks_.size());
  const int64_t k = recompute_.segment, last = last_segment_start();
  for (int64_t start = last, end = n; end > 0;
       end = start, start = std::max<int64_t>(start - k, 0)) {
    if (start < last) {
      const auto j = static_cast<size_t>(start / k);
      MOETRON_CHECK(j < ckpt_.inputs.size() && ckpt_.inputs[j].defined(),
                    "recompute: backward without the checkpoint of block ", start);
      Tensor x = std::move(ckpt_.inputs[j]);
      for (int64_t i = start; i < end; ++i) {
        x = blocks_[static_cast<size_t>(i)]->recompute_forward(
            ctx, x, saved_.positions, ckpt_.batch, ckpt_.seq, ckpt_.loss_weight, &saved_.media);
      }
    }
    for (int64_t i = end - 1; i >= start; --i) {
      d_x = blocks_[static_cast<size_t>(i)]->backward(ctx, d_x, d_media);
      block_grads_ready(static_cast<size_t>(i));
    }
  }
  release_checkpoints();
  return d_x;
}

}  // namespace moetron::nn
