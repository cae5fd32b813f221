// SelfAttention under context parallelism (parallel.cp, nn/context_parallel.h).
//
// Forward is ring attention: each rank's keys and values (its two chunks)
// go to the ranks 1, 2, .. c - 1 places further round the cp ring, one
// distance per step, by non-blocking send/recv (sent straight, not relayed,
// so a distance no rank can see is simply not sent); while the next block
// is in flight the rank attends its queries to the block it holds (its own
// first). Each (query chunk, key chunk) pair is one kernel call in
// the pair's own coordinates: keys at 0 .. C - 1, queries at q_offset = the
// chunks' distance, document starts shifted by the key chunk's offset (so
// windows, global tokens and packed documents mean what they mean in the
// whole sequence). The partial outputs merge by their log-sum-exps, so the
// result is the one softmax over every visible key. Under a sliding window
// without global tokens only distances 1 and c - 1 are exchanged
// (nn::context_ring_offsets).
//
// The blocks that arrive are kept, at their sequence positions, as the
// layer's saved keys and values (B x S, not B x S / c: one layer's K/V, the
// price of a backward without a second ring). Backward attends each local
// query chunk to the key prefix it can see (the chunked-sequence kernel
// call), sums dK, dV over the whole sequence in the accum dtype, and one
// reduce-scatter over the cp ranks hands each rank the sums for its chunks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "moetron/kernels/elementwise.h"
#include "moetron/nn/attention.h"

namespace moetron::nn {

namespace {

// acc (rows [B, L, H, hd]) and acc_lse ([B, H, L]) take in a partial result
// of rows row0 .. row0 + C of sequence b: part [C, H, hd] with part_lse [H, C].
template <typename T>
void merge_partial(const Tensor& part, const Tensor& part_lse, const Tensor& acc,
                   const Tensor& acc_lse, int64_t b, int64_t row0) {
  const int64_t L = acc.dim(1), H = acc.dim(2), hd = acc.dim(3), C = part.dim(0);
  const T* po = part.data<T>();
  const T* pl = part_lse.data<T>();
  T* ao = acc.data<T>();
  T* al = acc_lse.data<T>();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < C; ++i) {
      const T l = pl[h * C + i];
      if (l == kNegInf) continue;  // no visible key in this block
      T& total = al[(b * H + h) * L + row0 + i];
      T* a = ao + ((b * L + row0 + i) * H + h) * hd;
      const T* o = po + (i * H + h) * hd;
      if (total == kNegInf) {
        std::copy(o, o + hd, a);
        total = l;
        continue;
      }
      const T m = std::max(total, l);
      const T wa = std::exp(total - m), wo = std::exp(l - m), sum = wa + wo;
      for (int64_t d = 0; d < hd; ++d) a[d] = (a[d] * wa + o[d] * wo) / sum;
      total = m + std::log(sum);
    }
  }
}

void fill_negative_infinity(const Tensor& t) {
  if (t.dtype() == DType::f64) {
    std::fill_n(t.data<double>(), t.numel(), -std::numeric_limits<double>::infinity());
  } else {
    std::fill_n(t.data<float>(), t.numel(), -std::numeric_limits<float>::infinity());
  }
}

}  // namespace

Tensor SelfAttention::context_document_starts(const Tensor& positions, int64_t batch) const {
  const ContextParallel& cp = *cp_;
  const int64_t local = cp.local_seq(), seq = cp.seq;
  const int32_t* pos = positions.data<int32_t>();
  bool packed = false;
  for (int64_t i = 0; i < batch * local && !packed; ++i)
    packed = pos[i] != cp.position_of(cp.rank, i % local);
  if (!packed) return Tensor();
  Tensor starts = Tensor::zeros({batch * seq}, DType::i32);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < local; ++j) {
      const int64_t p = cp.position_of(cp.rank, j);
      starts.data<int32_t>()[b * seq + p] = static_cast<int32_t>(p - pos[b * local + j]);
    }
  }
  return starts;
}

void SelfAttention::attend_block(kernels::Context& ctx, const Saved& s, const Tensor& block,
                                 int64_t owner, float scale, const Tensor& acc,
                                 const Tensor& acc_lse) const {
  const ContextParallel& cp = *cp_;
  const int64_t C = cp.chunk(), seq = cp.seq;
  const Tensor part = Tensor::empty({1, C, h_, hd_}, prec_.compute, MemTag::workspace);
  const Tensor part_acc = Tensor::empty({C, h_, hd_}, prec_.accum, MemTag::workspace);
  const Tensor part_lse = Tensor::empty({1, h_, C}, prec_.accum, MemTag::workspace);
  const bool shifted_starts = s.doc_start.defined() || (mask_.window > 0 && mask_.num_global > 0);
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t kq = 0; kq < 2; ++kq) {
      const int64_t qo = cp.chunk_offset(cp.rank, kq);
      for (int64_t kk = 0; kk < 2; ++kk) {
        const int64_t ko = cp.chunk_offset(owner, kk);
        if (!context_chunk_visible(mask_, cp.documents, qo, ko, C)) continue;
        kernels::AttentionMask m = mask_;
        m.q_offset = qo - ko;
        if (shifted_starts) {
          // Starts in the pair's coordinates (key chunk at 0): negative for a
          // document that began before the key chunk.
          starts.assign(static_cast<size_t>(qo - ko + C), 0);
          for (int64_t i = 0; i < C; ++i) {
            const int64_t start =
                s.doc_start.defined() ? s.doc_start.data<int32_t>()[b * seq + qo + i] : 0;
            starts[static_cast<size_t>(qo - ko + i)] = static_cast<int32_t>(start - ko);
          }
          m.doc_start = starts.data();
          m.doc_stride = static_cast<int64_t>(starts.size());
        }
        const Shape kv{1, C, hkv_, hd_};
        kernels::attention_forward(ctx, s.q[b].slice(kq * C, (kq + 1) * C).reshape({1, C, h_, hd_}),
                                   block[0][b].slice(kk * C, (kk + 1) * C).reshape(kv),
                                   block[1][b].slice(kk * C, (kk + 1) * C).reshape(kv), m, scale,
                                   part, part_lse);
        kernels::convert(ctx, part.reshape({C, h_, hd_}), part_acc);
        if (prec_.accum == DType::f64) {
          merge_partial<double>(part_acc, part_lse.reshape({h_, C}), acc, acc_lse, b, kq * C);
        } else {
          merge_partial<float>(part_acc, part_lse.reshape({h_, C}), acc, acc_lse, b, kq * C);
        }
      }
    }
  }
}

void SelfAttention::keep_block(const Tensor& block, int64_t owner, const Tensor& k_all,
                               const Tensor& v_all) const {
  const ContextParallel& cp = *cp_;
  const int64_t C = cp.chunk();
  for (int64_t b = 0; b < k_all.dim(0); ++b) {
    for (int64_t kk = 0; kk < 2; ++kk) {
      const int64_t o = cp.chunk_offset(owner, kk);
      k_all[b].slice(o, o + C).copy_from(block[0][b].slice(kk * C, (kk + 1) * C));
      v_all[b].slice(o, o + C).copy_from(block[1][b].slice(kk * C, (kk + 1) * C));
    }
  }
}

void SelfAttention::ring_attention_forward(kernels::Context& ctx, Saved& s, float scale) {
  const ContextParallel& cp = *cp_;
  MOETRON_CHECK(cp.group && cp.group->size() == cp.size && cp.group->rank() == cp.rank,
                "context-parallel attention without its cp group (rank ", cp.rank, " of ", cp.size,
                ")");
  check_shape(s.k, "context-parallel keys", {s.batch, cp.local_seq(), hkv_, hd_});
  const int64_t B = s.batch, L = cp.local_seq();
  const Tensor k_all = Tensor::zeros({B, cp.seq, hkv_, hd_}, prec_.compute);
  const Tensor v_all = Tensor::zeros({B, cp.seq, hkv_, hd_}, prec_.compute);
  // This rank's block (its chunks' K and V) goes to every rank that sees it.
  Tensor own = Tensor::empty({2, B, L, hkv_, hd_}, prec_.compute, MemTag::comm);
  own[0].copy_from(s.k);
  own[1].copy_from(s.v);
  keep_block(own, cp.rank, k_all, v_all);
  const Tensor acc = Tensor::zeros({B, L, h_, hd_}, prec_.accum, MemTag::workspace);
  fill_negative_infinity(s.lse);
  const std::vector<int64_t> offsets = context_ring_offsets(cp, mask_);
  Tensor current = own;
  int64_t owner = cp.rank;
  for (size_t i = 0; i <= offsets.size(); ++i) {
    Tensor incoming;
    std::unique_ptr<comm::Work> recv, send;
    int64_t from = 0;
    if (i < offsets.size()) {  // the next block travels while this one is attended to
      const int64_t t = offsets[i];
      from = (cp.rank - t + cp.size) % cp.size;
      incoming = Tensor::empty(own.shape(), prec_.compute, MemTag::comm);
      recv = cp.group->recv_async(incoming, static_cast<int>(from), static_cast<int>(t));
      send =
          cp.group->send_async(own, static_cast<int>((cp.rank + t) % cp.size), static_cast<int>(t));
    }
    attend_block(ctx, s, current, owner, scale, acc, s.lse);
    if (i == offsets.size()) break;
    recv->wait();
    send->wait();
    current = incoming;
    owner = from;
    keep_block(current, owner, k_all, v_all);
  }
  kernels::convert(ctx, acc, s.out);
  s.k = k_all;
  s.v = v_all;
}

kernels::AttentionMask SelfAttention::prefix_mask(const Saved& s, int64_t b, int64_t qo) const {
  // A local query chunk at qo over the saved keys [0, qo + C) of sequence b.
  kernels::AttentionMask m = mask_;
  m.q_offset = qo;
  if (s.doc_start.defined()) {
    m.doc_start = s.doc_start.data<int32_t>() + b * cp_->seq;
    m.doc_stride = cp_->seq;
  }
  return m;
}

void SelfAttention::context_attention_forward(kernels::Context& ctx, const Saved& s, float scale,
                                              const Tensor& out, const Tensor& lse) const {
  // The saved whole-sequence K/V: each local query chunk over its prefix.
  const ContextParallel& cp = *cp_;
  const int64_t C = cp.chunk();
  const Tensor chunk_lse = Tensor::empty({1, h_, C}, prec_.accum, MemTag::workspace);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t kq = 0; kq < 2; ++kq) {
      const int64_t qo = cp.chunk_offset(cp.rank, kq), prefix = qo + C;
      const kernels::AttentionMask m = prefix_mask(s, b, qo);
      const Shape kv{1, prefix, hkv_, hd_};
      const auto rows = [&](const Tensor& t) {
        return t[b].slice(kq * C, (kq + 1) * C).reshape({1, C, h_, hd_});
      };
      kernels::attention_forward(ctx, rows(s.q), s.k[b].slice(0, prefix).reshape(kv),
                                 s.v[b].slice(0, prefix).reshape(kv), m, scale, rows(out),
                                 chunk_lse);
      for (int64_t h = 0; h < h_; ++h)
        lse[b][h].slice(kq * C, (kq + 1) * C).copy_from(chunk_lse[0][h]);
    }
  }
}

void SelfAttention::context_attention_backward(kernels::Context& ctx, const Saved& s,
                                               const Tensor& d_out, float scale, const Tensor& dq,
                                               const Tensor& dk, const Tensor& dv) const {
  const ContextParallel& cp = *cp_;
  const int64_t C = cp.chunk(), seq = cp.seq, B = s.batch, L = cp.local_seq();
  const Tensor dk_sum = Tensor::zeros({B, seq, hkv_, hd_}, prec_.accum, MemTag::workspace);
  const Tensor dv_sum = Tensor::zeros({B, seq, hkv_, hd_}, prec_.accum, MemTag::workspace);
  const Tensor dk_part = Tensor::empty({seq, hkv_, hd_}, prec_.compute, MemTag::workspace);
  const Tensor dv_part = Tensor::empty({seq, hkv_, hd_}, prec_.compute, MemTag::workspace);
  const Tensor chunk_lse = Tensor::empty({1, h_, C}, prec_.accum, MemTag::workspace);
  const Shape q1{1, C, h_, hd_};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kq = 0; kq < 2; ++kq) {
      const int64_t qo = cp.chunk_offset(cp.rank, kq), prefix = qo + C;
      const kernels::AttentionMask m = prefix_mask(s, b, qo);
      for (int64_t h = 0; h < h_; ++h)
        chunk_lse[0][h].copy_from(s.lse[b][h].slice(kq * C, (kq + 1) * C));
      const Shape kv{1, prefix, hkv_, hd_};
      const auto rows = [&](const Tensor& t) {
        return t[b].slice(kq * C, (kq + 1) * C).reshape(q1);
      };
      kernels::attention_backward(ctx, rows(d_out), rows(s.q), s.k[b].slice(0, prefix).reshape(kv),
                                  s.v[b].slice(0, prefix).reshape(kv), rows(s.out), chunk_lse, m,
                                  scale, rows(dq), dk_part.slice(0, prefix).reshape(kv),
                                  dv_part.slice(0, prefix).reshape(kv));
      kernels::axpy(ctx, 1.0f, dk_part.slice(0, prefix), dk_sum[b].slice(0, prefix));
      kernels::axpy(ctx, 1.0f, dv_part.slice(0, prefix), dv_sum[b].slice(0, prefix));
    }
  }
  // Every rank's sums, cut into the owners' blocks; the owner gets the total.
  const Tensor send = Tensor::empty({cp.size, 2, B, L, hkv_, hd_}, prec_.accum, MemTag::comm);
  for (int64_t r = 0; r < cp.size; ++r) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t kk = 0; kk < 2; ++kk) {
        const int64_t o = cp.chunk_offset(r, kk);
        send[r][0][b].slice(kk * C, (kk + 1) * C).copy_from(dk_sum[b].slice(o, o + C));
        send[r][1][b].slice(kk * C, (kk + 1) * C).copy_from(dv_sum[b].slice(o, o + C));
      }
    }
  }
  const Tensor mine = Tensor::empty({2, B, L, hkv_, hd_}, prec_.accum, MemTag::comm);
  cp.group->reduce_scatter(send, mine, comm::ReduceOp::sum);
  kernels::convert(ctx, mine[0], dk);
  kernels::convert(ctx, mine[1], dv);
}

}  // namespace moetron::nn
