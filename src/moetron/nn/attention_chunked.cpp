// SelfAttention over a sequence that arrives chunk by chunk (train.seq_chunk).
//
// Chunk c's queries sit at positions [o, o + len) of the sequence and attend
// to every key up to o + len: the cache keeps each chunk's keys and values
// (after RoPE, at their sequence positions) for the chunks after it. The
// kernel's mask takes the chunk's place through q_offset, so a local layer's
// chunk only visits the key tiles inside its window and the global ones.
//
// Backward runs the chunks from the last: chunk c's attention backward gives
// dK, dV over the whole prefix [0, o + len); they are summed into the cache's
// accumulators (accum dtype, so the sum over chunks loses nothing to bf16).
// Every query that sees position j sits in j's chunk or a later one, so when
// chunk c's turn comes its own positions' sums are complete: they go on
// through RoPE and the k/v projections like an unchunked backward's.
#include <algorithm>
#include <vector>

#include "moetron/kernels/elementwise.h"
#include "moetron/nn/attention.h"

namespace moetron::nn {

void SelfAttention::begin_sequence(int64_t batch, int64_t seq, const Tensor& doc_start) {
  MOETRON_CHECK(batch >= 1 && seq >= 1, "chunked attention over ", batch, " sequences of ", seq,
                " tokens");
  MOETRON_CHECK(!doc_start.defined() || doc_start.numel() == batch * seq,
                "chunked attention: document starts for ", batch, " x ", seq, " tokens, got ",
                doc_start.numel());
  cache_ = SequenceCache{};
  // Zeros: the diagonal key tile of a chunk reaches past its end, where the
  // cache holds no chunk yet; masked, but 0 * garbage could still be NaN.
  cache_.k = Tensor::zeros({batch, seq, hkv_, hd_}, prec_.compute);
  cache_.v = Tensor::zeros({batch, seq, hkv_, hd_}, prec_.compute);
  cache_.doc_start = doc_start;
  cache_.batch = batch;
  cache_.seq = seq;
}

void SelfAttention::keep_chunk_kv(const Saved& s) const {
  MOETRON_CHECK(s.batch == cache_.batch && s.offset >= 0 && s.offset + s.seq <= cache_.seq,
                "chunk [", s.offset, ", ", s.offset + s.seq, ") of ", s.batch,
                " sequences outside the chunked sequence of ", cache_.batch, " x ", cache_.seq);
  for (int64_t b = 0; b < s.batch; ++b) {
    cache_.k[b].slice(s.offset, s.offset + s.seq).copy_from(s.k[b]);
    cache_.v[b].slice(s.offset, s.offset + s.seq).copy_from(s.v[b]);
  }
}

namespace {

// One sequence's view of a chunk's call: batch 1, keys [0, prefix).
struct ChunkCall {
  kernels::AttentionMask mask;
  int64_t prefix = 0;
};

ChunkCall chunk_call(const kernels::AttentionMask& layer_mask, const Tensor& doc_start, int64_t seq,
                     int64_t b, int64_t offset, int64_t len) {
  ChunkCall c;
  c.mask = layer_mask;
  c.mask.q_offset = offset;
  c.prefix = offset + len;
  if (doc_start.defined()) {
    c.mask.doc_start = doc_start.data<int32_t>() + b * seq;
    c.mask.doc_stride = c.prefix;
  }
  return c;
}

// A half-open range of key positions.
struct KeyRange {
  int64_t begin = 0, end = 0;
};

// The keys chunk [offset, prefix) of a causal layer can see: for a local
// layer without packed documents the first G (global) positions and the
// W - 1 before the chunk with the chunk itself; otherwise the whole prefix.
// The kernel's dK/dV are zero elsewhere, so summing only these ranges into
// the cache's accumulators is exact and keeps a chunk's cost O(W + C + G)
// rather than O(prefix). (With documents the global keys sit at every
// document's start: left to the whole prefix.)
std::vector<KeyRange> visible_key_ranges(const kernels::AttentionMask& m, bool documents,
                                         int64_t offset, int64_t prefix) {
  if (m.window <= 0 || documents || !m.causal) return {{0, prefix}};
  const int64_t lo = std::max<int64_t>(0, offset - m.window + 1);
  const int64_t globals = std::min(m.num_global, prefix);
  // A chunk starting inside the global positions holds global queries,
  // which see every key before them; lo <= globals covers that case.
  if (lo <= globals) return {{0, prefix}};
  if (globals == 0) return {{lo, prefix}};
  return {{0, globals}, {lo, prefix}};
}

}  // namespace

void SelfAttention::chunk_attention_forward(kernels::Context& ctx, const Saved& s, float scale,
                                            const Tensor& out, const Tensor& lse) const {
  const int64_t len = s.seq;
  for (int64_t b = 0; b < s.batch; ++b) {
    const ChunkCall c = chunk_call(mask_, cache_.doc_start, cache_.seq, b, s.offset, len);
    const Shape kv{1, c.prefix, hkv_, hd_};
    kernels::attention_forward(ctx, s.q[b].reshape({1, len, h_, hd_}),
                               cache_.k[b].slice(0, c.prefix).reshape(kv),
                               cache_.v[b].slice(0, c.prefix).reshape(kv), c.mask, scale,
                               out[b].reshape({1, len, h_, hd_}), lse[b].reshape({1, h_, len}));
  }
}

void SelfAttention::chunk_attention_backward(kernels::Context& ctx, const Saved& s,
                                             const Tensor& d_out, float scale, const Tensor& dq,
                                             const Tensor& dk, const Tensor& dv) {
  const int64_t len = s.seq;
  if (!cache_.dk.defined()) {
    cache_.dk = Tensor::zeros(cache_.k.shape(), prec_.accum);
    cache_.dv = Tensor::zeros(cache_.v.shape(), prec_.accum);
  }
  const int64_t prefix = s.offset + len;
  const Tensor dk_prefix = Tensor::empty({1, prefix, hkv_, hd_}, prec_.compute, MemTag::workspace);
  const Tensor dv_prefix = Tensor::empty({1, prefix, hkv_, hd_}, prec_.compute, MemTag::workspace);
  const Shape q_shape{1, len, h_, hd_};
  for (int64_t b = 0; b < s.batch; ++b) {
    const ChunkCall c = chunk_call(mask_, cache_.doc_start, cache_.seq, b, s.offset, len);
    const Shape kv{1, c.prefix, hkv_, hd_};
    kernels::attention_backward(ctx, d_out[b].reshape(q_shape), s.q[b].reshape(q_shape),
                                cache_.k[b].slice(0, prefix).reshape(kv),
                                cache_.v[b].slice(0, prefix).reshape(kv), s.out[b].reshape(q_shape),
                                s.lse[b].reshape({1, h_, len}), c.mask, scale,
                                dq[b].reshape(q_shape), dk_prefix, dv_prefix);
    for (const KeyRange& r :
         visible_key_ranges(mask_, cache_.doc_start.defined(), s.offset, prefix)) {
      kernels::axpy(ctx, 1.0f, dk_prefix[0].slice(r.begin, r.end),
                    cache_.dk[b].slice(r.begin, r.end));
      kernels::axpy(ctx, 1.0f, dv_prefix[0].slice(r.begin, r.end),
                    cache_.dv[b].slice(r.begin, r.end));
    }
    kernels::convert(ctx, cache_.dk[b].slice(s.offset, prefix), dk[b]);
    kernels::convert(ctx, cache_.dv[b].slice(s.offset, prefix), dv[b]);
  }
}

}  // namespace moetron::nn
