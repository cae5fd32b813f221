// Reference attention: for every (batch, head, query row) the full softmax
// over the visible keys in double, and the textbook backward. No tiling and
// no online softmax: this is the oracle the blockwise CPU kernels are
// checked against.
#include "moetron/kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

namespace {

struct Dims {
  int64_t B, Sq, Sk, H, Hkv, hd;
  int64_t qi(int64_t b, int64_t i, int64_t h) const { return ((b * Sq + i) * H + h) * hd; }
  int64_t ki(int64_t b, int64_t j, int64_t h) const {
    return ((b * Sk + j) * Hkv + h / (H / Hkv)) * hd;
  }
};

Dims dims_of(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

// Softmax probabilities of row (b, h, i) over all Sk keys (0 where masked);
// returns the log-sum-exp, -inf when no key is visible.
double row_probs(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                 const AttentionMask& mask, double scale, int64_t b, int64_t h, int64_t i,
                 std::vector<double>& p) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  double m = kNegInf;
  const AttentionMask seq_mask = sequence_mask(mask, b);
  for (int64_t j = 0; j < d.Sk; ++j) {
    if (!attention_visible(seq_mask, i, j)) {
      p[j] = kNegInf;
      continue;
    }
    double s = 0;
    for (int64_t c = 0; c < d.hd; ++c) s += q[d.qi(b, i, h) + c] * k[d.ki(b, j, h) + c];
    p[j] = scale * s;
    m = std::max(m, p[j]);
  }
  if (m == kNegInf) {
    for (auto& x : p) x = 0;
    return kNegInf;
  }
  double sum = 0;
  for (int64_t j = 0; j < d.Sk; ++j) {
    p[j] = p[j] == kNegInf ? 0.0 : std::exp(p[j] - m);
    sum += p[j];
  }
  for (auto& x : p) x /= sum;
  return m + std::log(sum);
}

}  // namespace

void attention_forward(Context&, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, float scale, const Tensor& out,
                       const Tensor& lse) {
  check_attention_forward_args(q, k, v, mask, out, lse, /*allow_f64=*/true);
  const Dims d = dims_of(q, k);
  const auto qv = load_all(q), kv = load_all(k), vv = load_all(v);
  std::vector<double> o(static_cast<size_t>(out.numel())), l(static_cast<size_t>(lse.numel()));
  std::vector<double> p(static_cast<size_t>(d.Sk));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      for (int64_t i = 0; i < d.Sq; ++i) {
        l[(b * d.H + h) * d.Sq + i] = row_probs(d, qv, kv, mask, scale, b, h, i, p);
        for (int64_t j = 0; j < d.Sk; ++j) {
          for (int64_t c = 0; c < d.hd; ++c) o[d.qi(b, i, h) + c] += p[j] * vv[d.ki(b, j, h) + c];
        }
      }
    }
  }
  store_all(out, o);
  store_all(lse, l);
}

// P is recomputed from q and k (the saved lse is only shape-checked);
// D_i = rowsum(dO_i * O_i) uses the given out, as every FlashAttention
// backward does, so the result is the gradient at that forward output.
void attention_backward(Context&, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionMask& mask, float scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  check_attention_backward_args(dout, q, k, v, out, lse, mask, dq, dk, dv, /*allow_f64=*/true);
  const Dims d = dims_of(q, k);
  const auto qv = load_all(q), kv = load_all(k), vv = load_all(v);
  const auto ov = load_all(out), dov = load_all(dout);
  std::vector<double> gq(qv.size()), gk(kv.size()), gv(vv.size());
  std::vector<double> p(static_cast<size_t>(d.Sk));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      for (int64_t i = 0; i < d.Sq; ++i) {
        row_probs(d, qv, kv, mask, scale, b, h, i, p);
        const int64_t qo = d.qi(b, i, h);
        double D = 0;
        for (int64_t c = 0; c < d.hd; ++c) D += dov[qo + c] * ov[qo + c];
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (p[j] == 0) continue;  // masked (or underflowed): no gradient flows
          const int64_t ko = d.ki(b, j, h);
          double dpj = 0;
          for (int64_t c = 0; c < d.hd; ++c) dpj += dov[qo + c] * vv[ko + c];
          const double ds = p[j] * (dpj - D);
          for (int64_t c = 0; c < d.hd; ++c) {
            gv[ko + c] += p[j] * dov[qo + c];
            gq[qo + c] += scale * ds * kv[ko + c];
            gk[ko + c] += scale * ds * qv[qo + c];
          }
        }
      }
    }
  }
  store_all(dq, gq);
  store_all(dk, gk);
  store_all(dv, gv);
}

}  // namespace moetron::kernels::reference
