#include "moetron/kernels/attention.h"
#include "moetron/kernels/f16_staging.h"

#include <limits>

namespace moetron::kernels {

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, float scale, const Tensor& out,
                       const Tensor& lse) {
  if (needs_f16_staging(ctx, {&q, &k, &v, &out})) {
    return run_f16_staged(ctx, "attention_forward", [&](F16Staging& s) {
      cpu::attention_forward(ctx, s.in(q), s.in(k), s.in(v), mask, scale, s.out(out), lse);
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, attention_forward, q, k, v, mask, scale, out, lse);
}

void attention_backward(Context& ctx, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionMask& mask, float scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  if (needs_f16_staging(ctx, {&dout, &q, &k, &v, &out, &dq, &dk, &dv})) {
    return run_f16_staged(ctx, "attention_backward", [&](F16Staging& s) {
      cpu::attention_backward(ctx, s.in(dout), s.in(q), s.in(k), s.in(v), s.in(out), lse, mask,
                              scale, s.out(dq), s.out(dk), s.out(dv));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, attention_backward, dout, q, k, v, out, lse, mask, scale, dq, dk,
                          dv);
}

namespace {

// f16 runs the f32 kernel on staged copies of q, k, v, out (backward also
// dout, dq, dk, dv).
Scratch scratch_of(const char* fn, Backend backend, const AttentionShape& shape, bool backward) {
  const int64_t nq = shape.batch * shape.seq_q * shape.heads * shape.head_dim;
  const int64_t nk = shape.batch * shape.seq_k * shape.kv_heads * shape.head_dim;
  const bool f16 = shape.dtype == DType::f16;
  AttentionShape kernel = shape;
  if (f16) kernel.dtype = DType::f32;
  const auto own = [&] {
    return backward ? cpu::attention_backward_scratch(kernel)
                    : cpu::attention_forward_scratch(kernel);
  };
  if (backward) return call_scratch(fn, backend, f16, {nq, nq, nk, nk, nq, nq, nk, nk}, own);
  return call_scratch(fn, backend, f16, {nq, nk, nk, nq}, own);
}

}  // namespace

Scratch attention_forward_scratch(Backend backend, const AttentionShape& shape) {
  return scratch_of("attention_forward_scratch", backend, shape, false);
}

Scratch attention_backward_scratch(Backend backend, const AttentionShape& shape) {
  return scratch_of("attention_backward_scratch", backend, shape, true);
}

namespace {

void check_float_dtype(const Tensor& t, const char* name, bool allow_f64) {
  const DType d = t.dtype();
  // The reference also reads f16 (the CPU backend stages f16 through f32).
  MOETRON_CHECK(
      d == DType::f32 || d == DType::bf16 || (allow_f64 && (d == DType::f64 || d == DType::f16)),
      "attention: ", name, " must be f32 or bf16", allow_f64 ? " (or f64, f16)" : "", ", got ",
      t.str());
}

// Packed documents: causal, one start per query position p in [q_offset,
// q_offset + Sq) of a doc_stride-long row (doc_stride >= q_offset + Sq), each
// start <= p and never decreasing along the queries (what the CPU tiles'
// bounds rely on). A start may be negative: the document began before key 0
// (a key block cut out of a longer sequence, nn/attention_context_parallel.cpp).
void check_document_starts(const AttentionMask& mask, int64_t B, int64_t Sq) {
  if (!mask.doc_start) return;
  MOETRON_CHECK(mask.causal, "attention: document starts need a causal mask");
  MOETRON_CHECK(mask.doc_stride >= mask.q_offset + Sq, "attention: doc_stride ", mask.doc_stride,
                " does not cover every query position (q_offset ", mask.q_offset, " + ", Sq, ")");
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* s = mask.doc_start + b * mask.doc_stride;
    for (int64_t p = mask.q_offset; p < mask.q_offset + Sq; ++p) {
      MOETRON_CHECK(s[p] <= p && (p == mask.q_offset || s[p] >= s[p - 1]),
                    "attention: document start ", s[p], " of position ", p, " in sequence ", b,
                    " is not in [previous start, ", p, "]");
    }
  }
}

}  // namespace

void check_attention_forward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionMask& mask, const Tensor& out, const Tensor& lse,
                                  bool allow_f64) {
  MOETRON_CHECK(q.defined() && q.rank() == 4, "attention: q must be [B, Sq, H, hd], got ",
                q.defined() ? q.str() : "undefined");
  MOETRON_CHECK(k.defined() && k.rank() == 4, "attention: k must be [B, Sk, Hkv, hd], got ",
                k.defined() ? k.str() : "undefined");
  const int64_t B = q.dim(0), Sq = q.dim(1), H = q.dim(2), hd = q.dim(3);
  const int64_t Sk = k.dim(1), Hkv = k.dim(2);
  MOETRON_CHECK(hd >= 1 && H >= 1 && Hkv >= 1, "attention: empty head dimension in q ", q.str(),
                " / k ", k.str());
  MOETRON_CHECK(H % Hkv == 0, "attention: query heads ", H, " not a multiple of kv heads ", Hkv);
  MOETRON_CHECK(k.dim(0) == B && k.dim(3) == hd, "attention: k ", k.str(), " does not match q ",
                q.str(), " in batch or head_dim");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max() / 2;
  MOETRON_CHECK(
      Sq < kMax && Sk < kMax && mask.q_offset >= 0 && mask.q_offset + Sq < kMax &&
          mask.window < kMax && mask.num_global >= 0 && mask.num_global < kMax,
      "attention: sequence lengths, q_offset, window and num_global must be in [0, 2^30)");
  check_document_starts(mask, B, Sq);
  check_float_dtype(q, "q", allow_f64);
  check_tensor(k, "attention k", k.shape(), q.dtype());
  check_tensor(v, "attention v", k.shape(), q.dtype());
  check_tensor(out, "attention out", q.shape(), q.dtype());
  MOETRON_CHECK(lse.defined(), "attention: lse is undefined");
  check_shape(lse, "attention lse", Shape{B, H, Sq});
  MOETRON_CHECK(lse.dtype() == DType::f32 || (allow_f64 && lse.dtype() == DType::f64),
                "attention: lse must be f32", allow_f64 ? " or f64" : "", ", got ", lse.str());
}

void check_attention_backward_args(const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out, const Tensor& lse,
                                   const AttentionMask& mask, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, bool allow_f64) {
  check_attention_forward_args(q, k, v, mask, out, lse, allow_f64);
  check_tensor(dout, "attention dout", q.shape(), q.dtype());
  check_tensor(dq, "attention dq", q.shape(), q.dtype());
  check_tensor(dk, "attention dk", k.shape(), q.dtype());
  check_tensor(dv, "attention dv", k.shape(), q.dtype());
}

}  // namespace moetron::kernels
