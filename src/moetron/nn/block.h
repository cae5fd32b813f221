// One pre-norm decoder block: h = x + attn(norm1(x)); out = h + ffn(norm2(h)),
// the FFN dense SwiGLU or routed MoE by configuration.
//
// Saves for backward: x, h, both norms' 1/rms; the modules save their own inputs
// (the norm outputs). Recomputation (nn/recompute.h): with `norm` dropped the
// modules do not keep the norm outputs and backward rebuilds them from x and
// h; a checkpointed block is released after forward and rebuilt by
// recompute_forward (from the same x) before its backward.
//
// A language-model block may open with a gated cross-attention layer
// (nn/cross_attention.h, add_cross_attention) reading the micro-batch's media
// tokens: out = block(xattn(x, media)). It saves, swaps, releases and reruns
// (checkpointed blocks) with the block.
//
// 2-D tensor parallelism (nn/tensor_parallel_2d.h): forward and backward
// gather the attention's and dense FFN's weights along the grid column and
// backward sums their gradients back into the stored blocks.
//
// Tensor parallelism (nn/tensor_parallel.h): attention and a dense FFN are
// tp-sharded; a MoE FFN runs on this rank's token slice (taken from the
// full activations, or already held under sequence parallelism) and, without
// sequence parallelism, its output slices are all-gathered.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moetron/nn/attention.h"
#include "moetron/nn/cross_attention.h"
#include "moetron/nn/mlp.h"
#include "moetron/nn/moe.h"

namespace moetron::nn {

// Where a block's parameters are named and how it attends. The defaults are
// the language model's: "model.layers.{i}." names, causal attention with
// RoPE. An encoder's blocks ("vision.layers.{i}.", "audio.layers.{i}.") see
// every position of their sequence and take their positions from the
// encoder's own position embeddings (RoPE off).
struct BlockOptions {
  std::string layers_prefix = "model.layers.";
  bool causal = true;
  bool rope = true;
};

class Block {
 public:
  Block(const ModelConfig& model, const MoeConfig& moe, int64_t index, Precision prec,
        ParameterSet& params, ExpertParallel ep = {}, const TensorParallel* tp = nullptr,
        const BlockOptions& options = {});

  // x: [B*S, D] (a token slice [B*S/tp, D] under sequence parallelism); returns the block's output
  // [B*S, D] (a new tensor). media: what the cross-attention layer reads
  // (nullptr: no row has media); ignored without one.
  Tensor forward(kernels::Context& ctx, const Tensor& x, const Tensor& positions, int64_t batch,
                 int64_t seq, double loss_weight, MoeStats& moe_stats,
                 const MediaTokens* media = nullptr);
  // Returns the gradient wrt x; the cross-attention layer's media gradient
  // accumulates into d_media (skipped when undefined).
  Tensor backward(kernels::Context& ctx, const Tensor& d_out, const Tensor& d_media = Tensor());
  // Adds a gated cross-attention layer before the block, its parameters
  // named "<block prefix>cross_attn." (after everything registered so far).
  // Replicated over tp (each rank computes it whole); not with sequence parallelism.
  void add_cross_attention(const ModelConfig& model, ParameterSet& params);
  GatedCrossAttention* cross_attention() { return xattn_.get(); }
  void release();
  MoeLayer* moe() { return moe_.get(); }
  SelfAttention& attention() { return attn_; }
  const MoeLayer* moe() const { return moe_.get(); }
  int64_t index() const { return index_; }

  // Monitoring: while on, forward (not recompute_forward) adds its output's
  // sum of squares and element count, read and cleared by take_activation_sums.
  void track_activations(bool on) { track_activations_ = on; }
  std::pair<double, int64_t> take_activation_sums() {
    return {std::exchange(act_sum_squares_, 0.0), std::exchange(act_count_, 0)};
  }

  // Recompute flags of nn/recompute.h for this block's modules.
  void set_recompute(uint32_t modules);
  // Whether the block's forward is released and run again before backward
  // (its MoE keeps its routing to check the second forward against).
  void set_checkpointed(bool on);
  // The second forward of a checkpointed block: saves what backward needs,
  // counts no expert load; returns the output like forward.
  Tensor recompute_forward(kernels::Context& ctx, const Tensor& x, const Tensor& positions,
                           int64_t batch, int64_t seq, double loss_weight,
                           const MediaTokens* media = nullptr);
  // A checkpointed MoE block's recorded routing (empty for a dense block).
  Tensor take_routing_record() { return moe_ ? moe_->take_routing_record() : Tensor(); }
  void put_routing_record(Tensor record) {
    if (moe_) moe_->put_routing_record(std::move(record));
  }

 private:
  // `prefix`: the block's own, e.g. "model.layers.3.".
  Block(const ModelConfig& model, const MoeConfig& moe, int64_t index, Precision prec,
        ParameterSet& params, ExpertParallel ep, const TensorParallel* tp,
        const std::string& prefix);
  const TensorParallel* tp_;
  std::string prefix_;
  int64_t index_;
  int64_t d_;
  float eps_;
  Precision prec_;
  Parameter *norm1_, *norm2_;
  SelfAttention attn_;
  std::unique_ptr<SwiGluMlp> mlp_;
  std::unique_ptr<MoeLayer> moe_;
  std::unique_ptr<GatedCrossAttention> xattn_;
  bool drop_norm_ = false, drop_residual_ = false;
  bool track_activations_ = false;
  double act_sum_squares_ = 0;
  int64_t act_count_ = 0;
  Tensor rebuild_norm(kernels::Context& ctx, const Tensor& x, const Parameter& w) const;
  // Under a 2-D grid: the attention's and the dense MLP's weights, which
  // forward and backward gather along the grid column around each use
  // (nn/tensor_parallel_2d.h); the MoE's are not grid-split.
  std::vector<GridSlot> grid_slots();
  void rebuild_residual(kernels::Context& ctx);
  // The MoE works on a token slice of the full activations without sequence parallelism.
  bool moe_slices_tokens() const { return moe_ && tp_->on() && !tp_->sequence_parallel; }

 public:
  // What forward saved for backward. Pipeline parallelism keeps several
  // micro-batches in flight and swaps each one's in and out.
  struct Saved {
    Tensor x, h, rstd1, rstd2;
  };
  void swap_saved(Saved& other) { std::swap(saved_, other); }
  // Everything the block and its modules saved for one micro-batch.
  struct State {
    Saved block;
    SelfAttention::Saved attn;
    SwiGluMlp::Saved mlp;
    MoeLayer::Saved moe;
    GatedCrossAttention::Saved xattn;
  };
  void swap_state(State& s) {
    std::swap(saved_, s.block);
    if (xattn_) xattn_->swap_saved(s.xattn);
    attn_.swap_saved(s.attn);
    if (mlp_) mlp_->swap_saved(s.mlp);
    if (moe_) moe_->swap_saved(s.moe);
  }

 private:
  Saved saved_;
};

}  // namespace moetron::nn
