// The Transformer as pipeline chunks (nn/transformer.h, PipelinePlace):
// each micro-batch's saved tensors are swapped out of the blocks after its
// forward and back in before its backward, so any number of micro-batches
// can be in flight on a stage (1F1B keeps up to pp, GPipe all of them).
// Under recompute full / sqrt each chunk is checkpointed on its own: its
// micro-batch keeps the segments' inputs and routing records, and backward
// rebuilds a segment from its input before running back through it.
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/norm.h"
#include "moetron/nn/transformer.h"

namespace moetron::nn {

Tensor Transformer::chunk_forward(kernels::Context& ctx, const ChunkStep& at, const Tensor& in,
                                  const Tensor& targets, LossStats& stats) {
  const int64_t chunk = at.chunk, mb = at.mb, batch = at.batch, seq = at.seq;
  const double grad_scale = at.grad_scale, loss_weight = at.loss_weight;
  const bool backward = at.backward;
  MOETRON_CHECK(chunk >= 0 && chunk < num_chunks(), "pipeline chunk ", chunk, " of ", num_chunks());
  const bool first = chunk == 0 && embed_, last = chunk == num_chunks() - 1 && head_;
  for (MoeLayer* l : moe_layers()) l->set_balance_group(backward ? balance_group_ : nullptr);
  ChunkStash st;
  st.multimodal = at.multimodal ? at.multimodal : multimodal_;
  Tensor x;
  if (first) {
    MOETRON_CHECK(in.dtype() == DType::i32 && in.numel() == batch * seq,
                  "the first pipeline stage takes i32 [", batch, ", ", seq, "] token ids, got ",
                  in.str());
    st.ids = in.reshape({batch * seq});
    x = embed(ctx, st.ids);
    st.media = fuse_media(ctx, st.multimodal.get(), seq, x);
  } else {
    x = in;
  }
  route_by_modality(st.multimodal.get());
  const Tensor positions =
      at.positions.defined() ? at.positions : positions_of(first ? st.ids : at.ids, batch, seq);
  st.positions = positions;
  st.batch = batch;
  st.seq = seq;
  st.loss_weight = loss_weight;
  MoeStats ms;
  const auto [b0, b1] = chunks_[static_cast<size_t>(chunk)];
  const auto k = static_cast<size_t>(recompute_.segment);
  const bool checkpoint_all = backward && at.checkpoint_all && k > 0;
  const size_t last_segment = checkpoint_all ? b1 : (backward ? last_segment_start(b0, b1) : b0);
  st.last_segment = last_segment;
  // The MoE layers of checkpointed blocks keep their routing for the
  // recompute pass; under checkpoint_all that includes the last segment.
  if (backward)
    for (size_t i = b0; i < b1; ++i) blocks_[i]->set_checkpointed(i < last_segment);
  for (size_t i = b0; i < b1; ++i) {
    if (i < last_segment && (i - b0) % k == 0) st.segment_inputs.push_back(x);
    need_block(i);
    x = blocks_[i]->forward(ctx, x, positions, batch, seq, loss_weight, ms, &st.media);
    Block::State s;
    if (!backward) {
      blocks_[i]->release();
    } else if (i < last_segment) {
      st.routing.push_back(blocks_[i]->take_routing_record());
      blocks_[i]->release();
    } else {
      blocks_[i]->swap_state(s);
    }
    if (backward) st.blocks.push_back(std::move(s));
  }
  stats.aux_loss += ms.aux_loss + ms.entropy_loss;
  stats.z_loss += ms.z_loss;
  stats.dropped += ms.dropped;
  if (last) {
    st.head_deferred = checkpoint_all;
    head_forward(ctx, x, targets, grad_scale, backward && !checkpoint_all, st, stats);
    if (checkpoint_all) {
      st.rstd = Tensor();
      st.targets = targets;
      st.grad_scale = grad_scale;
    }
    st.x_final = x;
    x = Tensor();
  }
  if (backward) {
    MOETRON_CHECK(stash_.emplace(std::pair{chunk, mb}, std::move(st)).second, "micro-batch ", mb,
                  " is already in flight on pipeline chunk ", chunk);
  }
  return x;
}

void Transformer::head_forward(kernels::Context& ctx, const Tensor& x, const Tensor& targets,
                               double grad_scale, bool backward, ChunkStash& st, LossStats& stats) {
  const int64_t rows = x.dim(0);
  st.rstd = Tensor::empty({rows}, prec_.accum);
  need(final_norm_);
  Tensor h = Tensor::empty({rows, model_.d_model}, prec_.compute);
  kernels::rmsnorm_forward(ctx, x, final_norm_->value, static_cast<float>(model_.norm_eps), h,
                           st.rstd);
  st.d_h = head_loss(ctx, h, targets, grad_scale, backward, stats, st.multimodal.get());
}

std::vector<std::pair<size_t, size_t>> Transformer::backward_segments(size_t begin, size_t end,
                                                                      size_t last_segment) const {
  std::vector<std::pair<size_t, size_t>> segments;
  if (last_segment < end) segments.emplace_back(last_segment, end);
  const auto k = static_cast<size_t>(recompute_.segment);
  std::vector<size_t> starts;
  for (size_t s = begin; s < last_segment; s += k) starts.push_back(s);
  for (size_t j = starts.size(); j-- > 0;)
    segments.emplace_back(starts[j], std::min(starts[j] + k, last_segment));
  return segments;
}

Tensor Transformer::chunk_backward(kernels::Context& ctx, int64_t chunk, int64_t mb,
                                   const Tensor& d_out, bool final_grads) {
  auto it = stash_.find({chunk, mb});
  MOETRON_CHECK(it != stash_.end(), "pipeline backward of micro-batch ", mb, " on chunk ", chunk,
                " without its forward");
  ChunkStash st = std::move(it->second);
  stash_.erase(it);
  const bool first = chunk == 0 && embed_, last = chunk == num_chunks() - 1 && head_;
  Tensor d_x = d_out;
  if (last && st.head_deferred) {
    LossStats counted_in_forward;
    head_forward(ctx, st.x_final, st.targets, st.grad_scale, true, st, counted_in_forward);
  }
  if (last) {
    d_x = Tensor::empty({st.d_h.dim(0), model_.d_model}, prec_.compute);
    kernels::rmsnorm_backward(ctx, st.d_h, st.x_final, final_norm_->value, st.rstd, d_x,
                              final_norm_->grad);
    if (final_grads) {
      grad_ready(final_norm_);
      if (head_ != embed_) grad_ready(head_);
    }
  }
  MOETRON_CHECK(d_x.defined(), "pipeline backward of chunk ", chunk,
                " without the next stage's gradient");
  const auto [b0, b1] = chunks_[static_cast<size_t>(chunk)];
  const size_t last_segment = st.last_segment;
  route_by_modality(st.multimodal.get());  // the recomputed forwards route as the first did
  const auto k = static_cast<size_t>(recompute_.segment);
  // The cross-attention layers (all on the chunk with the embedding) sum their media gradients
  // here.
  const Tensor d_media = media_grad(st.media);
  for (const auto& [start, end] : backward_segments(b0, b1, last_segment)) {
    if (start < last_segment) {
      Tensor x = std::move(st.segment_inputs[(start - b0) / k]);
      for (size_t i = start; i < end; ++i) {
        blocks_[i]->put_routing_record(std::move(st.routing[i - b0]));
        x = blocks_[i]->recompute_forward(ctx, x, st.positions, st.batch, st.seq, st.loss_weight,
                                          &st.media);
      }
    } else {
      for (size_t i = start; i < end; ++i) blocks_[i]->swap_state(st.blocks[i - b0]);
    }
    for (size_t i = end; i-- > start;) {
      d_x = blocks_[i]->backward(ctx, d_x, d_media);
      if (final_grads) block_grads_ready(i);
    }
  }
  if (!first) return d_x;
  const Tensor d_full = column_parallel_input(tp_, d_x);
  fuse_media_backward(ctx, st.multimodal.get(), st.seq, d_full, d_media);
  embed_backward(ctx, st.ids, d_full);
  if (final_grads) {
    grad_ready(embed_);
    media_grads_ready();
  }
  return Tensor();
}

}  // namespace moetron::nn
