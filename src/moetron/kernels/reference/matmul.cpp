// Reference matmul family: triple loops in double, one rounding into the
// output. The oracle every other backend is compared against.
#include "moetron/kernels/matmul.h"

#include <vector>

#include "moetron/kernels/matmul_shapes.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

void matmul(Context&, const Tensor& a, const Tensor& b, const Tensor& c, const MatmulArgs& args) {
  const MatmulDims d = check_matmul(a, b, c, args, DtypePolicy::reference);
  const std::vector<double> va = load_all(a), vb = load_all(b);
  const int64_t m_ = d.m, n_ = d.n, k_ = d.k;
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    const double* pa = va.data() + bi * m_ * k_;
    const double* pb = vb.data() + (d.b_batched ? bi * k_ * n_ : 0);
    for (int64_t i = 0; i < m_; ++i) {
      for (int64_t j = 0; j < n_; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k_; ++p) {
          const double x = args.trans_a ? pa[p * m_ + i] : pa[i * k_ + p];
          const double y = args.trans_b ? pb[j * k_ + p] : pb[p * n_ + j];
          acc += x * y;
        }
        const int64_t ci = (bi * m_ + i) * n_ + j;
        double v = static_cast<double>(args.alpha) * acc;
        // beta == 0 must not read c: it may hold garbage (or NaN).
        if (args.beta != 0.0f) v += static_cast<double>(args.beta) * load(c, ci);
        store(c, ci, v);
      }
    }
  }
}

void grouped_matmul(Context&, const Tensor& x, const Tensor& w, std::span<const int64_t> offsets,
                    const Tensor& y, bool trans_w, float beta) {
  const GroupedDims d = check_grouped_matmul(x, w, offsets, y, trans_w, DtypePolicy::reference);
  const std::vector<double> vx = load_all(x), vw = load_all(w);
  for (int64_t e = 0; e < d.groups; ++e) {
    const double* pw = vw.data() + e * d.n * d.k;
    for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t) {
      for (int64_t j = 0; j < d.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < d.k; ++p) {
          const double wv = trans_w ? pw[j * d.k + p] : pw[p * d.n + j];
          acc += vx[static_cast<size_t>(t * d.k + p)] * wv;
        }
        const int64_t yi = t * d.n + j;
        if (beta != 0.0f) acc += static_cast<double>(beta) * load(y, yi);
        store(y, yi, acc);
      }
    }
  }
}

void grouped_matmul_weight_grad(Context&, const Tensor& dy, const Tensor& x,
                                std::span<const int64_t> offsets, const Tensor& dw, float beta) {
  const GroupedDims d = check_grouped_weight_grad(dy, x, offsets, dw, DtypePolicy::reference);
  const std::vector<double> vdy = load_all(dy), vx = load_all(x);
  for (int64_t e = 0; e < d.groups; ++e) {
    for (int64_t j = 0; j < d.n; ++j) {
      for (int64_t p = 0; p < d.k; ++p) {
        double acc = 0;
        for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t) {
          acc += vdy[static_cast<size_t>(t * d.n + j)] * vx[static_cast<size_t>(t * d.k + p)];
        }
        const int64_t wi = (e * d.n + j) * d.k + p;
        if (beta != 0.0f) acc += static_cast<double>(beta) * load(dw, wi);
        store(dw, wi, acc);
      }
    }
  }
}

}  // namespace moetron::kernels::reference
