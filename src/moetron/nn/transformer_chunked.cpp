// Chunked sequences (train.seq_chunk): a batch of long sequences goes
// through the whole model C positions at a time.
//
// Each chunk is run like a pipeline micro-batch of one stage
// (chunk_forward / chunk_backward keep its saved tensors, or only its
// checkpoints under recompute full / sqrt), so activations scale with C.
// Attention is the one module that reaches across chunks: every layer keeps
// the keys and values of the whole sequence (nn/attention_chunked.cpp), and
// backward runs the chunks from the last so each chunk's k/v gradients have
// every later query's share before the chunk goes back through its k/v
// projections. The cross-entropy already sums over tokens and the step
// divides by the step's target tokens (grad_scale), so chunking changes no
// gradient; the MoE balancing losses are weighted by each chunk's share of
// the tokens (z-loss, a mean over tokens, stays exact; the load-balancing
// loss, a product of two means, and capacity drops see one chunk at a time).
#include <chrono>

#include "moetron/nn/tensor_parallel_2d.h"
#include "moetron/nn/transformer.h"

namespace moetron::nn {

void Transformer::set_sequence_chunk(int64_t tokens) {
  MOETRON_CHECK(tokens >= 0, "train.seq_chunk must be >= 0 (0: off), got ", tokens);
  MOETRON_CHECK(tokens == 0 || (embed_ && head_ && chunks_.size() == 1),
                "train.seq_chunk needs the whole model on one pipeline stage (parallel.pp = 1)");
  MOETRON_CHECK(tokens == 0 || !cp_.on(), "train.seq_chunk with parallel.cp > 1: pick one");
  MOETRON_CHECK(tokens == 0 || !media_,
                "train.seq_chunk with multimodal prefixes is not supported yet");
  seq_chunk_ = tokens;
}

namespace {

// Columns [begin, end) of every row of a [B, S] tensor, as a new [B, end - begin].
Tensor columns(const Tensor& rows, int64_t begin, int64_t end) {
  const int64_t b = rows.dim(0);
  Tensor out = Tensor::empty({b, end - begin}, rows.dtype());
  for (int64_t i = 0; i < b; ++i) out[i].copy_from(rows[i].slice(begin, end));
  return out;
}

// Ends every layer's sequence cache however the pass ends.
struct SequenceScope {
  const std::vector<std::unique_ptr<Block>>& blocks;
  ~SequenceScope() {
    for (const auto& blk : blocks) blk->attention().end_sequence();
  }
};

}  // namespace

LossStats Transformer::forward_backward_chunked(kernels::Context& ctx, const Tensor& batch_inputs,
                                                const Tensor& batch_targets, double grad_scale,
                                                double loss_weight, bool backward) {
  MOETRON_CHECK(batch_inputs.dtype() == DType::i32, "inputs must be i32 [B, S], got ",
                batch_inputs.str());
  // A 2-D grid's row chunks its rows of the micro-batch (nn/tensor_parallel_2d.h).
  const Tensor inputs = grid_row_slice(tp_, batch_inputs);
  const Tensor targets = grid_row_slice(tp_, batch_targets);
  const int64_t b = inputs.dim(0), s = inputs.dim(1), c = seq_chunk_;
  MOETRON_CHECK(s <= model_.max_seq_len, "sequence of ", s,
                " tokens exceeds model.max_seq_len = ", model_.max_seq_len);
  const int64_t n = (s + c - 1) / c;
  const int64_t last = s - (n - 1) * c;
  MOETRON_CHECK((b * c) % tp_.size == 0 && (b * last) % tp_.size == 0, "train.seq_chunk = ", c,
                ": every chunk's ", b, " x chunk tokens (the last has ", last,
                " positions) must divide over parallel.tp = ", tp_.size);
  LossStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor positions = positions_of(inputs.reshape({b * s}), b, s);
  const Tensor doc_start = document_starts(positions, b, s);
  SequenceScope scope{blocks_};
  for (const auto& blk : blocks_) blk->attention().begin_sequence(b, s, doc_start);
  const Tensor position_rows = positions.reshape({b, s});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = i * c, end = std::min(s, begin + c);
    const double share = static_cast<double>(end - begin) / static_cast<double>(s);
    ChunkStep at;
    at.mb = i;
    at.batch = b;
    at.seq = end - begin;
    at.grad_scale = grad_scale;
    at.loss_weight = loss_weight * share;
    at.backward = backward;
    at.checkpoint_all = i + 1 < n;  // the last chunk's backward comes next
    at.positions = columns(position_rows, begin, end).reshape({b * (end - begin)});
    for (const auto& blk : blocks_) blk->attention().set_chunk(begin);
    LossStats cs;
    (void)chunk_forward(ctx, at, columns(inputs, begin, end), columns(targets, begin, end), cs);
    stats.ce_sum += cs.ce_sum;
    stats.tokens += cs.tokens;
    stats.add_tasks(cs);
    stats.aux_loss += cs.aux_loss * share;
    stats.z_loss += cs.z_loss * share;
    stats.dropped += cs.dropped;
  }
  const auto t1 = std::chrono::steady_clock::now();
  stats.forward_s = std::chrono::duration<double>(t1 - t0).count();
  if (!backward) return stats;
  for (int64_t i = n; i-- > 0;) {
    for (const auto& blk : blocks_) blk->attention().set_chunk(i * c);
    (void)chunk_backward(ctx, 0, i, Tensor(), i == 0);
  }
  stats.backward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return stats;
}

}  // namespace moetron::nn
