// Gated cross-attention (Flamingo), inserted into the language model every
// k layers so text tokens read the encoders' projected tokens ("media"):
//   y   = x + tanh(a) * o_proj(attn(q = norm1(x) Wq, k = media Wk, v = media Wv))
//   out = y + tanh(f) * mlp(norm2(y))
// a and f are scalar gates initialised to 0, so an inserted layer leaves the
// language model unchanged (out == x exactly) until training opens them.
// Every text token of row b attends to the first media_len[b] of the M
// media slots of row b (non-causal): an image row may bring 16 tokens, an
// audio row 8, a text row none. A row with media_len 0 attends to nothing:
// its attention output is 0 and its media slots get no gradient, nor do the
// unused slots [media_len[b], M) of any row. M may be 0 (media undefined):
// no row has media; the gated MLP still runs on every row.
//
// Parameters under `prefix` (e.g. "model.layers.3.cross_attn."):
//   input_layernorm.weight [D], {q,k,v,o}_proj.weight (as in self-attention),
//   attn_gate [1], post_attention_layernorm.weight [D],
//   mlp.{gate,up,down}_proj.weight (dense SwiGLU, model.ffn_hidden), mlp_gate [1].
//
// The gates are applied and their gradients summed on the host: CPU and
// reference backends. Not sharded: under tensor parallelism (without
// sequence parallelism) every tp rank runs the whole layer on its copy.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moetron/kernels/context.h"
#include "moetron/nn/mlp.h"
#include "moetron/nn/model_config.h"
#include "moetron/nn/parameter.h"

namespace moetron::nn {

// The encoders' tokens one micro-batch's cross-attention layers read
// (nn/media_fusion.h): row b's tokens are rows [b M, b M + lengths[b]) of
// tokens [B * M, D]; tokens undefined: no row has media.
struct MediaTokens {
  Tensor tokens;
  std::vector<int64_t> lengths;
};

class GatedCrossAttention {
 public:
  // Heads, head_dim, ffn_hidden, norm_eps and init_std from `model` (the
  // language model's); media come in its width, model.d_model.
  GatedCrossAttention(const ModelConfig& model, const std::string& prefix, Precision prec,
                      ParameterSet& params);

  // x: [B * S, D] text activations; media: [B * M, D] (compute dtype), M
  // slots per row, or undefined (M = 0); media_len: B counts in [0, M], or
  // empty when every row fills its M slots. Returns out [B * S, D] (a new tensor).
  Tensor forward(kernels::Context& ctx, const Tensor& x, const Tensor& media, int64_t batch,
                 int64_t seq, const std::vector<int64_t>& media_len = {});
  // Returns dx; d_media [B * M, D] += the media's gradient (skipped when
  // undefined); every parameter's gradient, the gates' included, accumulates.
  Tensor backward(kernels::Context& ctx, const Tensor& d_out, const Tensor& d_media);
  void release();
  Parameter& attn_gate() { return *attn_gate_; }
  Parameter& mlp_gate() { return *mlp_gate_; }

  // What forward saved (pipeline parallelism: several micro-batches in flight).
  struct Activations {
    Tensor x, media, n1, rstd1, q, k, v, out, lse, u, y, rstd2, m;
    std::vector<int64_t> media_len;  // B entries
    int64_t batch = 0, seq = 0, media_tokens = 0;
  };
  struct Saved {
    Activations own;
    SwiGluMlp::Saved mlp;
  };
  void swap_saved(Saved& other) {
    std::swap(saved_, other.own);
    mlp_.swap_saved(other.mlp);
  }

 private:
  int64_t d_, h_, hkv_, hd_;
  float eps_;
  Precision prec_;
  Parameter *norm1_, *norm2_, *wq_, *wk_, *wv_, *wo_, *attn_gate_, *mlp_gate_;
  SwiGluMlp mlp_;
  Activations saved_;
  // Zeroes item b's rows of t ([B, ...]) for every item without media.
  static void zero_items_without_media(const Activations& s, const Tensor& t);
  // Calls f(b0, b1, len) over rows [b0, b1) that attend to their first len
  // slots together (one attention call): runs of rows with len == M, or one
  // row with 0 < len < M (its slots are a contiguous prefix).
  template <typename F>
  static void for_each_attention_run(const Activations& s, F f);
  void attend(kernels::Context& ctx, Activations& s) const;
  void attend_backward(kernels::Context& ctx, const Activations& s, const Tensor& d_attn,
                       const Tensor& dq, const Tensor& dk, const Tensor& dv) const;
};

}  // namespace moetron::nn
