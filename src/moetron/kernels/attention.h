// Scaled dot-product attention, blockwise with an online softmax
// (FlashAttention-style): only the log-sum-exp is saved for backward, which
// recomputes the probabilities tile by tile.
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"
#include "moetron/kernels/workspace.h"

namespace moetron::kernels {

// Query row i sits at absolute position p = q_offset + i; key j at position j.
// Key j is visible from query p iff
//   (!causal || j <= p) and j >= s and
//   (window <= 0 || dist(p, j) < window || j - s < num_global || p - s < num_global)
// where dist is p - j when causal and |p - j| otherwise (Longformer-style
// sliding window with g global tokens that see and are seen by everyone),
// and s is the start of p's document: 0 for one document per sequence, or,
// for packed documents (causal only), doc_start[b * doc_stride + p] in
// sequence b, so no query sees another document and each document's first
// num_global positions are its global tokens.
struct AttentionMask {
  bool causal = true;
  int64_t window = 0;
  int64_t num_global = 0;
  int64_t q_offset = 0;
  // Packed documents: i32 starts indexed by query position, doc_stride per
  // sequence (at least q_offset + Sq; Sk for a whole sequence), each start
  // <= its position and never decreasing along the queries; a negative
  // start is a document that began before key 0. nullptr: none.
  const int32_t* doc_start = nullptr;
  int64_t doc_stride = 0;
};

// The mask of sequence b alone: its document starts at doc_start[0 .. Sk).
inline AttentionMask sequence_mask(const AttentionMask& mask, int64_t b) {
  AttentionMask m = mask;
  if (m.doc_start) m.doc_start += b * m.doc_stride;
  return m;
}

// The start of the document holding absolute position p, for a mask of
// one sequence (sequence_mask).
inline int64_t document_start(const AttentionMask& mask, int64_t p) {
  return mask.doc_start ? mask.doc_start[p] : 0;
}

// Whether key j is visible from query row i under `mask`, a mask of one
// sequence (sequence_mask) (shared by every backend).
inline bool attention_visible(const AttentionMask& mask, int64_t i, int64_t j) {
  const int64_t p = mask.q_offset + i;
  if (mask.causal && j > p) return false;
  const int64_t s = document_start(mask, p);
  if (j < s) return false;
  if (mask.window <= 0) return true;
  const int64_t dist = mask.causal ? p - j : (p > j ? p - j : j - p);
  return dist < mask.window || j - s < mask.num_global || p - s < mask.num_global;
}

// q: [B, Sq, H, hd]; k, v: [B, Sk, Hkv, hd] with H % Hkv == 0, query head h
// reading kv head h / (H / Hkv) (grouped-query attention). out: [B, Sq, H, hd].
// lse: [B, H, Sq] f32 (or f64), log sum_j exp(scale q.k_j) over visible keys;
// a row with no visible key gets out = 0 and lse = -inf.
// q, k, v, out: f32 or bf16, all the same (reference also f64).
MOETRON_KERNEL_DECL(void attention_forward(Context& ctx, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const AttentionMask& mask, float scale,
                                           const Tensor& out, const Tensor& lse))

// dq: [B, Sq, H, hd], dk, dv: [B, Sk, Hkv, hd], all overwritten (dk/dv summed
// over the query heads sharing a kv head). Dtype of q.
MOETRON_KERNEL_DECL(void attention_backward(Context& ctx, const Tensor& dout, const Tensor& q,
                                            const Tensor& k, const Tensor& v, const Tensor& out,
                                            const Tensor& lse, const AttentionMask& mask,
                                            float scale, const Tensor& dq, const Tensor& dk,
                                            const Tensor& dv))

// The sizes of one attention call: q [batch, seq_q, heads, head_dim], k and
// v [batch, seq_k, kv_heads, head_dim], all of `dtype`.
struct AttentionShape {
  int64_t batch = 1, seq_q = 0, seq_k = 0, heads = 1, kv_heads = 1, head_dim = 0;
  DType dtype = DType::f32;
};

// The workspace a call of attention_forward / attention_backward on
// `backend` allocates for `shape`, held at once at the call's peak (see
// kernels/workspace.h): the CPU kernels' packed tiles and per-thread
// accumulators, after, for f16, the staged f32 copies of every f16 tensor
// (q, k, v, out; backward also dout, dq, dk, dv; all distinct). The
// reference keeps its doubles in uncounted vectors: nothing.
Scratch attention_forward_scratch(Backend backend, const AttentionShape& shape);
Scratch attention_backward_scratch(Backend backend, const AttentionShape& shape);
namespace cpu {
// The CPU kernels' own scratch for f32 or bf16 tensors (kernels/cpu/attention_scratch.cpp).
Scratch attention_forward_scratch(const AttentionShape& shape);
Scratch attention_backward_scratch(const AttentionShape& shape);
}  // namespace cpu

// Argument checks shared by every backend: shapes as above, dtypes equal
// (f64 only where allow_f64, i.e. the reference), lse f32 (or f64 with
// allow_f64), head_dim >= 1, H % Hkv == 0, and sizes below 2^31 (the CPU
// backend's masks work on 32-bit positions). Throws moetron::Error naming the
// argument. Backward passes its dout/out/dq/dk/dv as well.
void check_attention_forward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionMask& mask, const Tensor& out, const Tensor& lse,
                                  bool allow_f64);
void check_attention_backward_args(const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out, const Tensor& lse,
                                   const AttentionMask& mask, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, bool allow_f64);

}  // namespace moetron::kernels
