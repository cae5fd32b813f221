// Grouped-query self-attention with RoPE: q, k, v column-parallel
// projections, blockwise attention (full causal, or a sliding window with
// global tokens: ModelConfig's hybrid pattern), o row-parallel projection.
//
// Saves for backward: the normalised input x, q and k after RoPE, v, the
// attention output (before o_proj) and its log-sum-exp. Nothing S x S.
// Recomputation (nn/recompute.h): attn_core drops the attention output and
// backward rebuilds it from q, k, v; attn_q and attn_kv drop q and k, v
// (whole sequences on one rank only: not under context parallelism or
// chunked sequences) and backward projects them again from x; norm drops
// x, which the block rebuilds and hands back through restore_input before
// backward. attn_residual (the block's) asks for o_proj's output again
// through project_output.
//
// Tensor parallelism (nn/tensor_parallel.h): each tp rank holds n_heads / tp
// query heads and their kv heads, n_kv_heads / tp of them, or, when tp
// exceeds n_kv_heads, the one kv head its query heads share (replicated over
// the tp / n_kv_heads ranks of tp.kv_group, whose partial k/v weight
// gradients are summed there each backward).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moetron/kernels/attention.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/context_parallel.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/tensor_parallel.h"
#include "moetron/nn/tensor_parallel_2d.h"

namespace moetron::nn {

class SelfAttention {
 public:
  // `layer` picks the mask: sliding window + global tokens where
  // layer_is_local(cfg, layer), full causal otherwise.
  SelfAttention(const ModelConfig& cfg, int64_t layer, const std::string& prefix, Precision prec,
                ParameterSet& params, const TensorParallel* tp = nullptr);

  // x: [B * S, D] (rows batch-major), positions: i32 [B * S]; y: [B * S, D] overwritten.
  // Positions that restart within a sequence mark packed documents: a token
  // attends only within its document (p - position is where it starts).
  // Under sequence parallelism x and y (and dy, dx) are this rank's token
  // slice [B * S / tp, D]; positions stay those of all B * S tokens.
  void forward(kernels::Context& ctx, const Tensor& x, const Tensor& positions, int64_t batch,
               int64_t seq, const Tensor& y);
  // dx: [B * S, D] overwritten with the gradient wrt x; weight grads accumulate.
  void backward(kernels::Context& ctx, const Tensor& dy, const Tensor& dx);
  void release();  // drops what forward saved
  // Under a 2-D grid: q, k, v and o gathered along the grid column for use.
  std::vector<GridSlot> grid_slots();
  void set_drop_core(bool drop) { drop_core_ = drop; }
  void set_drop_projections(bool q, bool kv) {
    drop_q_ = q;
    drop_kv_ = kv;
  }
  void drop_input() { saved_.x = Tensor(); }
  void restore_input(const Tensor& x) { saved_.x = column_parallel_input(*tp_, x); }
  bool has_input() const { return saved_.x.defined(); }
  // Rebuilding the attention output (attn_core dropped) needs the input back first.
  bool has_output() const { return saved_.out.defined(); }
  // y = o_proj(attention output) again, bit for bit the forward's (the
  // output and q, k, v rebuilt first if dropped). One tp rank only: under
  // tp the forward's sum over ranks would have to run again.
  void project_output(kernels::Context& ctx, const Tensor& y);
  const kernels::AttentionMask& mask() const { return mask_; }
  // Encoders (nn/vision_encoder.h, nn/audio_encoder.h): every position sees
  // every other one (causal off) and positions come from the encoder's own
  // embeddings (RoPE off). Chunked sequences and context parallelism assume
  // the defaults (causal, RoPE on).
  void set_causal(bool causal) { mask_.causal = causal; }
  void set_rope(bool on) { rope_ = on; }

  // Chunked sequences (train.seq_chunk, Transformer::set_sequence_chunk):
  // forward and backward see one chunk [offset, offset + len) of every
  // sequence at a time (positions stay those of the whole sequence). Each
  // chunk's keys and values stay here for the later chunks to attend to;
  // backward runs the chunks in reverse and collects here the dK, dV every
  // later chunk sent to earlier positions, so a chunk's own k/v gradient is
  // complete when its turn comes. doc_start: i32 [B * S] document starts of
  // the whole batch, or undefined for one document per sequence.
  void begin_sequence(int64_t batch, int64_t seq, const Tensor& doc_start);
  void set_chunk(int64_t offset) { cache_.offset = offset; }
  void end_sequence() { cache_ = SequenceCache{}; }

  // Context parallelism (nn/context_parallel.h): forward and backward see
  // this rank's two chunks of every sequence (positions: theirs in the whole
  // sequence); keys and values travel the cp ring. `cp` outlives the module;
  // nullptr or size 1: off.
  void set_context_parallel(const ContextParallel* cp) { cp_ = cp; }

 private:
  const TensorParallel* tp_;
  const ContextParallel* cp_ = nullptr;
  int64_t d_, h_, hkv_, hd_;  // h_, hkv_: this rank's heads
  bool kv_replicated_ = false;
  float theta_;
  bool rope_ = true;
  kernels::AttentionMask mask_;
  Parameter *wq_, *wk_, *wv_, *wo_;
  Precision prec_;
  bool drop_core_ = false, drop_q_ = false, drop_kv_ = false;
  struct SequenceCache {
    Tensor k, v;       // [B, S, hkv, hd] compute dtype: the chunks seen so far
    Tensor dk, dv;     // [B, S, hkv, hd] accum: allocated by the first backward
    Tensor doc_start;  // i32 [B * S] or undefined
    int64_t batch = 0, seq = 0, offset = 0;
    bool on() const { return k.defined(); }
  } cache_;

 public:
  // What forward saved for backward. Pipeline parallelism keeps several
  // micro-batches in flight and swaps each one's in and out.
  struct Saved {
    Tensor x, positions, doc_start, q, k, v, out, lse;  // doc_start: undefined for one document
    int64_t batch = 0, seq = 0;
    // A chunk of a chunked sequence starts here (its k, v are in the cache,
    // not in k, v); -1: the whole sequence.
    int64_t offset = -1;
    // Context parallelism: q, out, lse are this rank's chunks; k, v the
    // whole sequence's (gathered around the ring); doc_start i32 [B * S]
    // indexed by sequence position (only this rank's filled), or undefined.
    bool context_parallel = false;
    // ... with all-to-all exchanges (ContextParallel::all_to_all): q, k, v,
    // lse and out_heads are the whole sequence's for 1/c of the heads; out
    // stays this rank's chunks (o_proj's input).
    bool ulysses = false;
    Tensor out_heads;
  };
  void swap_saved(Saved& other) { std::swap(saved_, other); }

 private:
  Saved saved_;
  // Recomputation: q, k, v projected again from the saved input if dropped,
  // then the attention output from them.
  void rebuild_projections(kernels::Context& ctx);
  void rebuild_output(kernels::Context& ctx, float scale);
  // mask_ with the saved document starts, if any.
  kernels::AttentionMask mask_for(const Saved& s) const;
  // Attention of a chunk's queries over the cached keys and values up to its
  // end (nn/attention_chunked.cpp), one sequence at a time.
  void keep_chunk_kv(const Saved& s) const;
  void chunk_attention_forward(kernels::Context& ctx, const Saved& s, float scale,
                               const Tensor& out, const Tensor& lse) const;
  // dq of the chunk; dk, dv of the chunk's own positions (the cache's sums
  // over this and every later chunk).
  void chunk_attention_backward(kernels::Context& ctx, const Saved& s, const Tensor& d_out,
                                float scale, const Tensor& dq, const Tensor& dk, const Tensor& dv);

  // Context parallelism (nn/attention_context_parallel.cpp).
  bool context_parallel() const { return cp_ && cp_->on(); }
  Tensor context_document_starts(const Tensor& positions, int64_t batch) const;
  // Ring attention: fills s.out, s.lse; s.k, s.v become the whole sequence's.
  void ring_attention_forward(kernels::Context& ctx, Saved& s, float scale);
  // The queries of `block` ([2 (k, v), B, 2C, hkv, hd], cp rank `owner`'s
  // chunks) merged into acc [B, 2C, h, hd] and acc_lse [B, h, 2C] (accum).
  void attend_block(kernels::Context& ctx, const Saved& s, const Tensor& block, int64_t owner,
                    float scale, const Tensor& acc, const Tensor& acc_lse) const;
  void keep_block(const Tensor& block, int64_t owner, const Tensor& k_all,
                  const Tensor& v_all) const;
  kernels::AttentionMask prefix_mask(const Saved& s, int64_t b, int64_t qo) const;
  // From the saved whole-sequence K/V, no communication (attn_core recompute).
  void context_attention_forward(kernels::Context& ctx, const Saved& s, float scale,
                                 const Tensor& out, const Tensor& lse) const;
  // All-to-all context parallelism (nn/attention_ulysses.cpp): [B, L, n, hd]
  // this rank's chunks, every head <-> [B, S, n / c, hd] every position,
  // this rank's heads. Collective over the cp group.
  Tensor sequence_to_heads(const Tensor& local) const;
  void heads_to_sequence(const Tensor& heads, const Tensor& local) const;
  Tensor sequence_document_starts(const Tensor& positions, int64_t batch) const;
  void ulysses_forward(kernels::Context& ctx, Saved& s, float scale);
  void ulysses_core(kernels::Context& ctx, Saved& s, float scale) const;
  void ulysses_backward(kernels::Context& ctx, Saved& s, const Tensor& d_out, float scale,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);
  // dq of the local chunks; dk, dv of them summed over every cp rank's queries.
  void context_attention_backward(kernels::Context& ctx, const Saved& s, const Tensor& d_out,
                                  float scale, const Tensor& dq, const Tensor& dk,
                                  const Tensor& dv) const;
};

// i32 [B * S] document starts p - positions[p], or undefined when every
// sequence is one document (positions 0 .. S - 1).
Tensor document_starts(const Tensor& positions, int64_t batch, int64_t seq);

}  // namespace moetron::nn
