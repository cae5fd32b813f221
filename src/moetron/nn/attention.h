// Grouped-query self-attention with RoPE: q, k, v column-parallel
// projections, blockwise attention (full causal, or a sliding window with
// global tokens: ModelConfig's hybrid pattern), o row-parallel projection.
//
// Saves for backward: the normalised input x, q and k after RoPE, v, the
// attention output (before o_proj) and its log-sum-exp. Nothing S x S.
// Recomputation (nn/recompute.h): attn_core drops the attention output and
// backward rebuilds it from q, k, v; norm drops x, which the block rebuilds
// and hands back through restore_input before backward.
//
// Tensor parallelism (nn/tensor_parallel.h): each tp rank holds n_heads / tp
// query heads and their kv heads, n_kv_heads / tp of them, or, when tp
// exceeds n_kv_heads, the one kv head its query heads share (replicated over
// the tp / n_kv_heads ranks of tp.kv_group, whose partial k/v weight
// gradients are summed there each backward).
#pragma once

#include <string>
#include <utility>

#include "moetron/kernels/attention.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter.h"
#include "moetron/nn/tensor_parallel.h"

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
  void set_drop_core(bool drop) { drop_core_ = drop; }
  void drop_input() { saved_.x = Tensor(); }
  void restore_input(const Tensor& x) { saved_.x = column_parallel_input(*tp_, x); }
  const kernels::AttentionMask& mask() const { return mask_; }

 private:
  const TensorParallel* tp_;
  int64_t d_, h_, hkv_, hd_;  // h_, hkv_: this rank's heads
  bool kv_replicated_ = false;
  float theta_;
  kernels::AttentionMask mask_;
  Parameter *wq_, *wk_, *wv_, *wo_;
  Precision prec_;
  bool drop_core_ = false;

 public:
  // What forward saved for backward. Pipeline parallelism keeps several
  // micro-batches in flight and swaps each one's in and out.
  struct Saved {
    Tensor x, positions, doc_start, q, k, v, out, lse;  // doc_start: undefined for one document
    int64_t batch = 0, seq = 0;
  };
  void swap_saved(Saved& other) { std::swap(saved_, other); }

 private:
  Saved saved_;
  // mask_ with the saved document starts, if any.
  kernels::AttentionMask mask_for(const Saved& s) const;
};

// i32 [B * S] document starts p - positions[p], or undefined when every
// sequence is one document (positions 0 .. S - 1).
Tensor document_starts(const Tensor& positions, int64_t batch, int64_t seq);

}  // namespace moetron::nn
