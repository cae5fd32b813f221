// SelfAttention under context parallelism with all-to-all exchanges
// (parallel.cp_comm = "all_to_all", DeepSpeed-Ulysses style): instead of
// passing K/V around a ring, one all-to-all turns q, k, v from "this rank's
// two chunks, every head" into "the whole sequence, 1/c of the heads"; each
// rank runs the plain full-sequence kernel on its heads, and another
// all-to-all brings the output back to the rank's chunks. Backward mirrors
// it (d_out out, dq/dk/dv back). Needs the rank's query and kv heads to
// divide by cp; every rank then does exactly 1/c of the attention, one
// kernel call, no merging and no whole-sequence dK/dV sums.
#include <cstring>

#include "moetron/nn/attention.h"

namespace moetron::nn {

namespace {

// Rows of `t` ([B, L, n, hd] or [B, S, n/c, hd]) as bytes.
char* row_ptr(const Tensor& t, int64_t b, int64_t row) {
  const int64_t row_elems = t.dim(2) * t.dim(3);
  return static_cast<char*>(t.raw()) +
         static_cast<size_t>((b * t.dim(1) + row) * row_elems) * dtype_size(t.dtype());
}

}  // namespace

Tensor SelfAttention::sequence_to_heads(const Tensor& local) const {
  const ContextParallel& cp = *cp_;
  const int64_t c = cp.size, B = local.dim(0), L = local.dim(1), n = local.dim(2),
                hd = local.dim(3), nu = n / c;
  const size_t run = static_cast<size_t>(nu * hd) * dtype_size(local.dtype());
  const Tensor send = Tensor::empty({c, B, L, nu, hd}, local.dtype(), MemTag::comm);
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(row_ptr(send[j], b, l), row_ptr(local, b, l) + static_cast<size_t>(j) * run,
                    run);
    }
  }
  const Tensor recv = Tensor::empty(send.shape(), local.dtype(), MemTag::comm);
  cp.group->alltoall(send, recv);
  Tensor heads = Tensor::empty({B, cp.seq, nu, hd}, local.dtype());
  for (int64_t r = 0; r < c; ++r) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(row_ptr(heads, b, cp.position_of(r, l)), row_ptr(recv[r], b, l), run);
    }
  }
  return heads;
}

void SelfAttention::heads_to_sequence(const Tensor& heads, const Tensor& local) const {
  const ContextParallel& cp = *cp_;
  const int64_t c = cp.size, B = local.dim(0), L = local.dim(1), nu = heads.dim(2),
                hd = heads.dim(3);
  const size_t run = static_cast<size_t>(nu * hd) * dtype_size(heads.dtype());
  const Tensor send = Tensor::empty({c, B, L, nu, hd}, heads.dtype(), MemTag::comm);
  for (int64_t r = 0; r < c; ++r) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(row_ptr(send[r], b, l), row_ptr(heads, b, cp.position_of(r, l)), run);
    }
  }
  const Tensor recv = Tensor::empty(send.shape(), heads.dtype(), MemTag::comm);
  cp.group->alltoall(send, recv);
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(row_ptr(local, b, l) + static_cast<size_t>(j) * run, row_ptr(recv[j], b, l),
                    run);
    }
  }
}

Tensor SelfAttention::sequence_document_starts(const Tensor& positions, int64_t batch) const {
  // Every rank's positions, so each knows where every document starts.
  const ContextParallel& cp = *cp_;
  const int64_t L = cp.local_seq(), S = cp.seq;
  const Tensor all = Tensor::empty({cp.size, batch * L}, DType::i32, MemTag::comm);
  cp.group->allgather(positions.reshape({batch * L}), all);
  Tensor starts = Tensor::empty({batch * S}, DType::i32);
  bool packed = false;
  for (int64_t r = 0; r < cp.size; ++r) {
    const int32_t* pos = all[r].data<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t l = 0; l < L; ++l) {
        const int64_t p = cp.position_of(r, l);
        const int64_t start = p - pos[b * L + l];
        packed = packed || start != 0;
        starts.data<int32_t>()[b * S + p] = static_cast<int32_t>(start);
      }
    }
  }
  return packed ? starts : Tensor();
}

void SelfAttention::ulysses_forward(kernels::Context& ctx, Saved& s, float scale) {
  const ContextParallel& cp = *cp_;
  s.doc_start = sequence_document_starts(s.positions, s.batch);
  s.q = sequence_to_heads(s.q);
  s.k = sequence_to_heads(s.k);
  s.v = sequence_to_heads(s.v);
  s.lse = Tensor::empty({s.batch, h_ / cp.size, cp.seq}, prec_.accum);
  s.ulysses = true;
  ulysses_core(ctx, s, scale);
}

void SelfAttention::ulysses_core(kernels::Context& ctx, Saved& s, float scale) const {
  const ContextParallel& cp = *cp_;
  kernels::AttentionMask m = mask_;
  if (s.doc_start.defined()) {
    m.doc_start = s.doc_start.data<int32_t>();
    m.doc_stride = cp.seq;
  }
  if (!s.out_heads.defined()) s.out_heads = Tensor::empty(s.q.shape(), prec_.compute);
  if (!s.out.defined()) s.out = Tensor::empty({s.batch, s.seq, h_, hd_}, prec_.compute);
  kernels::attention_forward(ctx, s.q, s.k, s.v, m, scale, s.out_heads, s.lse);
  heads_to_sequence(s.out_heads, s.out);
}

void SelfAttention::ulysses_backward(kernels::Context& ctx, Saved& s, const Tensor& d_out,
                                     float scale, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv) {
  const ContextParallel& cp = *cp_;
  kernels::AttentionMask m = mask_;
  if (s.doc_start.defined()) {
    m.doc_start = s.doc_start.data<int32_t>();
    m.doc_stride = cp.seq;
  }
  const Tensor d_out_heads = sequence_to_heads(d_out);
  const Tensor dq_h = Tensor::empty(s.q.shape(), prec_.compute);
  const Tensor dk_h = Tensor::empty(s.k.shape(), prec_.compute);
  const Tensor dv_h = Tensor::empty(s.v.shape(), prec_.compute);
  kernels::attention_backward(ctx, d_out_heads, s.q, s.k, s.v, s.out_heads, s.lse, m, scale, dq_h,
                              dk_h, dv_h);
  heads_to_sequence(dq_h, dq);
  heads_to_sequence(dk_h, dk);
  heads_to_sequence(dv_h, dv);
}

}  // namespace moetron::nn
