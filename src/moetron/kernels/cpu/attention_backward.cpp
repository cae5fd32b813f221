// CPU attention backward: recomputes each visible tile's probabilities from
// the saved log-sum-exp and runs the five tile GEMMs
//   S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K
// with dS = P * (dP - D) * scale and D_i = rowsum(dO_i * O_i).
//
// Parallel over (batch, query head): one task walks key blocks (outer) and
// the query blocks they see (inner), so dK/dV of a key block accumulate in
// one tile and dQ of the head in one per-task buffer. Every sum is formed by
// one thread in a fixed order, and with grouped-query heads the per-head
// dK/dV partials are added in head order afterwards, so the result has the
// same bits for every thread count.

#include <cmath>
#include <limits>
#include <vector>

#include "moetron/kernels/attention.h"
#include "moetron/kernels/cpu/attention_tiles.h"
#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/vec_math.h"

namespace moetron::kernels::cpu {

namespace {

using namespace attn;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Per tile: s = Q K^T and dp = dO V^T (f32, kBq x kBk) in; out P (for P^T dO,
// "pk" layout: [kBq / P][kBk][P]), scale * dS row-major (for dS K) and in the
// pk layout (for dS^T Q). For f32 the pk layout is the row-major one and
// ds_pk is not written.
template <typename T>
void grad_tile(const float* s, const float* dp, const float* L, const float* D, T* p_pk, T* ds_rm,
               T* ds_pk, float scale, bool partial, const AttentionMask& mask, int64_t i0,
               int64_t j0, int64_t Sk) {
  constexpr int kV = kBk / 16;
  const simd::vf vscale = simd::set1(scale);
  for (int64_t r = 0; r < kBq; r += 2) {
    for (int v = 0; v < kV; ++v) {
      simd::vf pr[2], dsr[2];
      for (int t = 0; t < 2; ++t) {
        const int64_t row = r + t, at = row * kBk + 16 * v;
        const simd::vf x = simd::fmsub(simd::load(s + at), vscale, simd::set1(L[row]));
        pr[t] = exp16(x);
        if (partial) {
          pr[t] = simd::keep(visible16(mask, mask.q_offset + i0 + row, j0 + 16 * v, Sk), pr[t]);
        }
        const simd::vf g = simd::sub(simd::load(dp + at), simd::set1(D[row]));
        dsr[t] = simd::mul(simd::mul(pr[t], g), vscale);
      }
      if constexpr (kPack<T> == 1) {
        for (int t = 0; t < 2; ++t) {
          simd::store(p_pk + (r + t) * kBk + 16 * v, pr[t]);
          simd::store(ds_rm + (r + t) * kBk + 16 * v, dsr[t]);
        }
      } else {
        const int64_t pk = (r / 2) * kBk * 2 + 32 * v;
        // (row, row + 1) pairs: the [k/2][n][2] layout that lets a tile whose
        // rows are the reduction index feed micro_bf16 as A.
        simd::store_bf16_pairs(p_pk + pk, pr[0], pr[1]);
        simd::store_bf16_pairs(ds_pk + pk, dsr[0], dsr[1]);
        simd::store(reinterpret_cast<bf16*>(ds_rm + r * kBk + 16 * v), dsr[0]);
        simd::store(reinterpret_cast<bf16*>(ds_rm + (r + 1) * kBk + 16 * v), dsr[1]);
      }
    }
  }
}

template <typename T>
void store_rows(const float* acc, int64_t hdp, int64_t rows, int64_t hd, T* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < hd; c += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, hd - c));
      store_f32_as(dst + r * ld + c, simd::load(acc + r * hdp + c), n);
    }
  }
}

// Whether any query block sees key block kb.
bool key_block_seen(const AttentionMask& mask, int64_t kb, int64_t nqb, int64_t Sq, int64_t Sk) {
  for (int64_t qb = 0; qb < nqb; ++qb) {
    if (classify_tile(mask, qb * kBq, kb * kBk, Sq, Sk) != TileKind::empty) return true;
  }
  return false;
}

// Query head bh's Q and dO tiles, packed row-major (and kn for bf16), with
// each row's lse (L) and D = rowsum(dO * O). Padded rows and rows with no
// visible key get lse = +inf, so their P is exactly 0 (after the mask) or
// flushes to 0.
template <typename T>
void pack_head_rows(const Tensor& q, const Tensor& dout, const Tensor& out, const Tensor& lse,
                    int64_t bh, T* q_rm, T* do_rm, T* q_kn, T* do_kn, float* L, float* D) {
  constexpr int P = kPack<T>;
  const int64_t Sq = q.dim(1), H = q.dim(2), hd = q.dim(3), hdp = round_up(hd, 16);
  const int64_t b = bh / H, h = bh % H, nqb = ceil_div(Sq, kBq), qtile = kBq * hdp;
  for (int64_t qb = 0; qb < nqb; ++qb) {
    const int64_t i0 = qb * kBq, off = ((b * Sq + i0) * H + h) * hd;
    const int64_t rows = std::min(kBq, Sq - i0);
    T* qr = q_rm + qb * qtile;
    T* dr = do_rm + qb * qtile;
    pack_rows(ptr<T>(q) + off, H * hd, rows, hd, qr, kBq, hdp);
    pack_rows(ptr<T>(dout) + off, H * hd, rows, hd, dr, kBq, hdp);
    if constexpr (P == 2) {
      pack_kn(qr, kBq, hdp, q_kn + qb * qtile);
      pack_kn(dr, kBq, hdp, do_kn + qb * qtile);
    }
    for (int64_t r = 0; r < kBq; ++r) {
      float* Lr = L + qb * kBq + r;
      float* Dr = D + qb * kBq + r;
      if (r >= rows) {
        *Lr = kInf;
        *Dr = 0;
        continue;
      }
      const float l = ptr<float>(lse)[bh * Sq + i0 + r];
      *Lr = l == -kInf ? kInf : l;
      const T* o = ptr<T>(out) + off + r * H * hd;
      const T* g = ptr<T>(dout) + off + r * H * hd;
      simd::vf acc = simd::zero();
      for (int64_t c = 0; c < hd; c += 16) {
        const int n = static_cast<int>(std::min<int64_t>(16, hd - c));
        acc = simd::fmadd(load_as_f32(o + c, n), load_as_f32(g + c, n), acc);
      }
      *Dr = simd::reduce_add(acc);
    }
  }
}

// Grouped-query heads: each kv head's dK/dV is the sum of its group's query
// heads' f32 slices in `partial` ([2][B * H][key blocks x tile]), in head order.
template <typename T>
void sum_group_partials(const Tensor& partial, int64_t B, int64_t H, int64_t Hkv, int64_t Sk,
                        int64_t hd, const Tensor& dk, const Tensor& dv) {
  const int64_t group = H / Hkv, hdp = round_up(hd, 16);
  const int64_t nkb = ceil_div(Sk, kBk), ktile = kBk * hdp;
  const int64_t plane = B * H * nkb * ktile;
#pragma omp parallel
  {
    WorkspaceVector<float> sk(static_cast<size_t>(hdp)), sv(static_cast<size_t>(hdp));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < B * Hkv * Sk; ++t) {
      const int64_t j = t % Sk, b = t / Sk / Hkv, kvh = (t / Sk) % Hkv;
      std::fill(sk.begin(), sk.end(), 0.0f);
      std::fill(sv.begin(), sv.end(), 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        const float* pk = ptr<float>(partial) + (b * H + kvh * group + g) * nkb * ktile + j * hdp;
        for (int64_t c = 0; c < hd; ++c) {
          sk[c] += pk[c];
          sv[c] += pk[plane + c];
        }
      }
      const int64_t off = ((b * Sk + j) * Hkv + kvh) * hd;
      store_rows(sk.data(), hdp, 1, hd, ptr<T>(dk) + off, hd);
      store_rows(sv.data(), hdp, 1, hd, ptr<T>(dv) + off, hd);
    }
  }
}

template <typename T>
void backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const AttentionMask& mask, float scale,
                   const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  constexpr int P = kPack<T>;
  const int64_t B = q.dim(0), Sq = q.dim(1), H = q.dim(2), hd = q.dim(3);
  const int64_t Sk = k.dim(1), Hkv = k.dim(2), group = H / Hkv;
  const int64_t hdp = round_up(hd, 16);
  const int64_t nqb = ceil_div(Sq, kBq), nkb = ceil_div(Sk, kBk);
  const int64_t ktile = kBk * hdp, qtile = kBq * hdp;

  // With grouped heads each query head's dK/dV go to its own f32 slice,
  // summed over the group in head order below.
  Tensor partial;
  if (group > 1) partial = Tensor::empty({2, B * H, nkb * ktile}, DType::f32, MemTag::workspace);

#pragma omp parallel
  {
    // Packed operands of the task's head: per key block K for Q K^T (nk) and
    // dS K (kn), V for dO V^T (nk); per query block Q and dO row-major (A of S
    // and dP) and kn (B of dS^T Q and P^T dO; for f32 the row-major tile
    // itself), the row's lse and D.
    WorkspaceVector<T> k_nk(static_cast<size_t>(nkb * ktile)), k_kn(k_nk.size()), v_nk(k_nk.size());
    WorkspaceVector<T> q_rm(static_cast<size_t>(nqb * qtile)), do_rm(q_rm.size());
    WorkspaceVector<T> q_kn(P == 1 ? 0 : q_rm.size()), do_kn(q_kn.size());
    WorkspaceVector<T> raw(static_cast<size_t>(ktile));
    WorkspaceVector<float> L(static_cast<size_t>(nqb * kBq)), D(L.size());
    WorkspaceVector<float> dq_acc(static_cast<size_t>(nqb * qtile));
    WorkspaceVector<float> dk_acc(static_cast<size_t>(ktile)), dv_acc(static_cast<size_t>(ktile));
    WorkspaceVector<float> s(static_cast<size_t>(kBq * kBk)), dp(static_cast<size_t>(kBq * kBk));
    WorkspaceVector<T> p_pk(static_cast<size_t>(kBq * kBk)), ds_rm(static_cast<size_t>(kBq * kBk));
    WorkspaceVector<T> ds_pk(static_cast<size_t>(kBq * kBk));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      const AttentionMask seq_mask = sequence_mask(mask, b);
      pack_head_rows<T>(q, dout, out, lse, bh, q_rm.data(), do_rm.data(), q_kn.data(), do_kn.data(),
                        L.data(), D.data());
      std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const T* kn = k_nk.data() + kb * ktile;
        const T* vn = v_nk.data() + kb * ktile;
        const T* kk = k_kn.data() + kb * ktile;
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
        // A key block no query sees (outside a chunk's window, say) is
        // neither packed nor multiplied: its dK/dV rows are stored as zeros.
        if (key_block_seen(seq_mask, kb, nqb, Sq, Sk)) {
          const int64_t off = ((b * Sk + kb * kBk) * Hkv + kvh) * hd;
          const int64_t rows = std::min(kBk, Sk - kb * kBk);
          pack_rows(ptr<T>(k) + off, Hkv * hd, rows, hd, raw.data(), kBk, hdp);
          pack_nk(raw.data(), kBk, hdp, k_nk.data() + kb * ktile);
          pack_kn(raw.data(), kBk, hdp, k_kn.data() + kb * ktile);
          pack_rows(ptr<T>(v) + off, Hkv * hd, rows, hd, raw.data(), kBk, hdp);
          pack_nk(raw.data(), kBk, hdp, v_nk.data() + kb * ktile);
        }
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const TileKind kind = classify_tile(seq_mask, qb * kBq, kb * kBk, Sq, Sk);
          if (kind == TileKind::empty) continue;
          const T* qr = q_rm.data() + qb * qtile;
          const T* dor = do_rm.data() + qb * qtile;
          const T* qk = P == 1 ? qr : q_kn.data() + qb * qtile;
          const T* dok = P == 1 ? dor : do_kn.data() + qb * qtile;
          gemm_tile<T>(qr, hdp / P, 1, kn, kBq, kBk, hdp, s.data(), kBk, false);
          gemm_tile<T>(dor, hdp / P, 1, vn, kBq, kBk, hdp, dp.data(), kBk, false);
          grad_tile<T>(s.data(), dp.data(), L.data() + qb * kBq, D.data() + qb * kBq, p_pk.data(),
                       ds_rm.data(), ds_pk.data(), scale, kind == TileKind::partial, seq_mask,
                       qb * kBq, kb * kBk, Sk);
          const T* dsk = P == 1 ? ds_rm.data() : ds_pk.data();
          gemm_tile<T>(p_pk.data(), 1, kBk, dok, kBk, hdp, kBq, dv_acc.data(), hdp, true);
          gemm_tile<T>(dsk, 1, kBk, qk, kBk, hdp, kBq, dk_acc.data(), hdp, true);
          gemm_tile<T>(ds_rm.data(), kBk / P, 1, kk, kBq, hdp, kBk, dq_acc.data() + qb * qtile, hdp,
                       true);
        }
        const int64_t rows = std::min(kBk, Sk - kb * kBk);
        if (group == 1) {
          const int64_t off = ((b * Sk + kb * kBk) * Hkv + kvh) * hd;
          store_rows(dk_acc.data(), hdp, rows, hd, ptr<T>(dk) + off, Hkv * hd);
          store_rows(dv_acc.data(), hdp, rows, hd, ptr<T>(dv) + off, Hkv * hd);
        } else {
          float* pk = ptr<float>(partial) + (bh * nkb + kb) * ktile;
          float* pv = pk + B * H * nkb * ktile;
          std::copy(dk_acc.begin(), dk_acc.end(), pk);
          std::copy(dv_acc.begin(), dv_acc.end(), pv);
        }
      }
      const int64_t off = (b * Sq * H + h) * hd;
      store_rows(dq_acc.data(), hdp, Sq, hd, ptr<T>(dq) + off, H * hd);
    }
  }

  if (group > 1) sum_group_partials<T>(partial, B, H, Hkv, Sk, hd, dk, dv);
}

}  // namespace

void attention_backward(Context&, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionMask& mask, float scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  check_attention_backward_args(dout, q, k, v, out, lse, mask, dq, dk, dv, /*allow_f64=*/false);
  if (q.dtype() == DType::f32) {
    backward_impl<float>(dout, q, k, v, out, lse, mask, scale, dq, dk, dv);
  } else {
    backward_impl<uint16_t>(dout, q, k, v, out, lse, mask, scale, dq, dk, dv);
  }
}

}  // namespace moetron::kernels::cpu
