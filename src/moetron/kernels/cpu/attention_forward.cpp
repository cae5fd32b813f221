// CPU attention forward: FlashAttention-style tiles with an online softmax.
// Every (batch, head, chunk of query blocks) is an independent task: it
// packs the K/V tiles it needs into the layouts the micro-kernels read and,
// per query block, walks the key blocks the mask leaves visible
// (skipping empty tiles, masking elementwise only on boundary tiles), so
// causal costs ~S^2/2 and a sliding window O(S (w + g)).

#include <omp.h>

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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Folds one tile's scores into the running softmax state of kBq rows: s holds
// the raw scores S = Q K^T (kBq x kBk, f32; overwritten by the scaled, masked
// scores); p receives exp(scale S - m_new) as T, row-major; m, l are the
// running max and sum, alpha the factor the caller applies to the output
// accumulator rows before adding P V.
template <typename T>
void softmax_tile(float* s, T* p, float* m, float* l, float* alpha, float scale, bool partial,
                  const AttentionMask& mask, int64_t i0, int64_t j0, int64_t Sk) {
  constexpr int kV = kBk / 16;
  simd::mask16 vis[kBq][kV];
  float m_new[kBq];
  const simd::vf vscale = simd::set1(scale);
  for (int64_t r = 0; r < kBq; ++r) {
    float* row = s + r * kBk;
    simd::vf mx = simd::set1(kNegInf);
    for (int v = 0; v < kV; ++v) {
      simd::vf x = simd::mul(simd::load(row + 16 * v), vscale);
      if (partial) {
        vis[r][v] = visible16(mask, mask.q_offset + i0 + r, j0 + 16 * v, Sk);
        x = simd::blend(vis[r][v], simd::set1(kNegInf), x);
      }
      simd::store(row + 16 * v, x);
      mx = simd::max(mx, x);
    }
    m_new[r] = std::max(m[r], simd::reduce_max(mx));
  }
  // alpha = exp(m_old - m_new) for 16 rows at a time. A row that has seen no
  // visible key keeps m = -inf; its exponent base is taken as 0 so that
  // exp(-inf - base) = 0 instead of NaN.
  for (int64_t r = 0; r < kBq; r += 16) {
    const simd::vf mo = simd::load(m + r), mn = simd::load(m_new + r);
    const simd::mask16 live = simd::less(simd::set1(kNegInf), mn);  // false for NaN
    const simd::vf base = simd::keep(live, mn);
    simd::store(alpha + r, simd::keep(live, exp16(simd::sub(mo, base))));
    simd::store(m + r, mn);
    simd::store(m_new + r, base);
  }
  for (int64_t r = 0; r < kBq; ++r) {
    const float* row = s + r * kBk;
    T* prow = p + r * kBk;
    const simd::vf base = simd::set1(m_new[r]);
    simd::vf sum = simd::zero();
    for (int v = 0; v < kV; ++v) {
      simd::vf e = exp16(simd::sub(simd::load(row + 16 * v), base));
      // Masked lanes must be exactly 0: exp512 of -inf may leave a denormal.
      if (partial) e = simd::keep(vis[r][v], e);
      sum = simd::add(sum, e);
      store_f32_as(prow + 16 * v, e, 16);
    }
    l[r] = l[r] * alpha[r] + simd::reduce_add(sum);
  }
}

template <typename T>
void forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                  float scale, const Tensor& out, const Tensor& lse) {
  constexpr int P = kPack<T>;
  const int64_t B = q.dim(0), Sq = q.dim(1), H = q.dim(2), hd = q.dim(3);
  const int64_t Sk = k.dim(1), Hkv = k.dim(2), group = H / Hkv;
  const int64_t hdp = round_up(hd, 16);
  const int64_t nqb = ceil_div(Sq, kBq), nkb = ceil_div(Sk, kBk);
  const int64_t tile = kBk * hdp;  // elements of one packed K or V tile
  const T* qp = ptr<T>(q);
  const T* kp = ptr<T>(k);
  const T* vp = ptr<T>(v);
  T* op = ptr<T>(out);
  float* lp = ptr<float>(lse);

  // Tasks: (batch, head, chunk of query blocks). One chunk per head unless
  // there are too few heads to keep every thread busy; a task packs the K/V
  // tiles its chunk sees on first use, so each is packed once per task.
  const int64_t threads = omp_get_max_threads();
  const int64_t nchunks = std::min(nqb, ceil_div(4 * threads, B * H));
  const int64_t per_chunk = ceil_div(nqb, nchunks);

#pragma omp parallel
  {
    // K as [hdp / P][kBk][P] (B operand of Q K^T), V as [kBk / P][hdp][P] (of P V).
    WorkspaceVector<T> kt(static_cast<size_t>(nkb * tile)), vt(static_cast<size_t>(nkb * tile));
    WorkspaceVector<T> raw(static_cast<size_t>(tile));
    WorkspaceVector<int64_t> packed_by(static_cast<size_t>(nkb), -1);
    WorkspaceVector<T> qtile(static_cast<size_t>(kBq * hdp)), ptile(static_cast<size_t>(kBq * kBk));
    WorkspaceVector<float> s(static_cast<size_t>(kBq * kBk)), o(static_cast<size_t>(kBq * hdp));
    WorkspaceVector<float> m(kBq), l(kBq), alpha(kBq);
    // Later query blocks see more keys under a causal mask: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < B * H * nchunks; ++u) {
      const int64_t chunk = nchunks - 1 - u / (B * H), b = (u % (B * H)) / H, h = u % H;
      const int64_t kvh = h / group;
      const AttentionMask seq_mask = sequence_mask(mask, b);
      for (int64_t qb = chunk * per_chunk; qb < std::min(nqb, (chunk + 1) * per_chunk); ++qb) {
        const int64_t i0 = qb * kBq, rows = std::min(kBq, Sq - i0);
        pack_rows(qp + ((b * Sq + i0) * H + h) * hd, H * hd, rows, hd, qtile.data(), kBq, hdp);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t kb = 0; kb < nkb; ++kb) {
          const TileKind kind = classify_tile(seq_mask, i0, kb * kBk, Sq, Sk);
          if (kind == TileKind::empty) continue;
          T* ktile = kt.data() + kb * tile;
          T* vtile = vt.data() + kb * tile;
          if (packed_by[kb] != u) {
            const int64_t off = ((b * Sk + kb * kBk) * Hkv + kvh) * hd;
            const int64_t krows = std::min(kBk, Sk - kb * kBk);
            pack_rows(kp + off, Hkv * hd, krows, hd, raw.data(), kBk, hdp);
            pack_nk(raw.data(), kBk, hdp, ktile);
            pack_rows(vp + off, Hkv * hd, krows, hd, raw.data(), kBk, hdp);
            pack_kn(raw.data(), kBk, hdp, vtile);
            packed_by[kb] = u;
          }
          gemm_tile<T>(qtile.data(), hdp / P, 1, ktile, kBq, kBk, hdp, s.data(), kBk, false);
          softmax_tile<T>(s.data(), ptile.data(), m.data(), l.data(), alpha.data(), scale,
                          kind == TileKind::partial, seq_mask, i0, kb * kBk, Sk);
          for (int64_t r = 0; r < kBq; ++r) {
            if (alpha[r] == 1.0f) continue;
            const simd::vf a = simd::set1(alpha[r]);
            float* orow = o.data() + r * hdp;
            for (int64_t c = 0; c < hdp; c += 16) {
              simd::store(orow + c, simd::mul(a, simd::load(orow + c)));
            }
          }
          gemm_tile<T>(ptile.data(), kBk / P, 1, vtile, kBq, hdp, kBk, o.data(), hdp, true);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          T* dst = op + ((b * Sq + i) * H + h) * hd;
          // A row with no visible key: out 0, lse -inf (the header's contract).
          const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
          const simd::vf vinv = simd::set1(inv);
          for (int64_t c = 0; c < hd; c += 16) {
            const int n = static_cast<int>(std::min<int64_t>(16, hd - c));
            store_f32_as(dst + c, simd::mul(vinv, simd::load(o.data() + r * hdp + c)), n);
          }
          lp[(b * H + h) * Sq + i] = l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf;
        }
      }
    }
  }
}

}  // namespace

void attention_forward(Context&, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, float scale, const Tensor& out,
                       const Tensor& lse) {
  check_attention_forward_args(q, k, v, mask, out, lse, /*allow_f64=*/false);
  if (q.dtype() == DType::f32) {
    forward_impl<float>(q, k, v, mask, scale, out, lse);
  } else {
    forward_impl<uint16_t>(q, k, v, mask, scale, out, lse);
  }
}

}  // namespace moetron::kernels::cpu
