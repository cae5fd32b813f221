#include "moetron/optim/newton_schulz.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moetron/kernels/matmul.h"
#include "util/test_util.h"

namespace moetron::optim {
namespace {

// Eigenvalues of a symmetric matrix by cyclic Jacobi rotations (test-only, small n).
std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; ++p) {
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // rotate columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rotate rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ev[static_cast<size_t>(i)] = a[i * n + i];
  return ev;
}

// Singular values of a [r, c] f32 matrix: sqrt of the eigenvalues of the smaller Gram matrix.
std::vector<double> singular_values(const Tensor& o) {
  const int64_t r = o.dim(0), c = o.dim(1);
  const int64_t m = std::min(r, c);
  std::vector<double> gram(static_cast<size_t>(m * m), 0.0);
  const float* p = o.data<float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      if (r <= c) {
        for (int64_t k = 0; k < c; ++k) s += static_cast<double>(p[i * c + k]) * p[j * c + k];
      } else {
        for (int64_t k = 0; k < r; ++k) s += static_cast<double>(p[k * c + i]) * p[k * c + j];
      }
      gram[static_cast<size_t>(i * m + j)] = s;
    }
  std::vector<double> ev = symmetric_eigenvalues(gram, static_cast<int>(m));
  for (double& e : ev) e = std::sqrt(std::max(e, 0.0));
  return ev;
}

TEST(NewtonSchulz, SingularValuesLandInTheQuinticsBand) {
  // Keller Jordan's coefficients trade exact orthogonality for speed: after 5
  // steps the singular values sit in roughly (0.5, 1.5) (his stated band), a
  // band far from the inputs' spread, which spans orders of magnitude here.
  kernels::Context cpu(kernels::Backend::cpu);
  for (auto [r, c] : {std::pair<int64_t, int64_t>{24, 64}, {96, 40}, {33, 130}}) {
    Tensor g = test::random_tensor({r, c}, DType::f32, "g");
    // Spread the input's spectrum: scale row i by 2^(i mod 6).
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        g.data<float>()[i * c + j] *= static_cast<float>(1 << (i % 6));
    Tensor o = test::poisoned({r, c}, DType::f32);
    newton_schulz(cpu, g, o, 5);
    const auto sv = singular_values(o);
    const auto in = singular_values(g);
    EXPECT_GT(*std::max_element(in.begin(), in.end()) / *std::min_element(in.begin(), in.end()),
              10.0);
    for (double s : sv) {
      EXPECT_GT(s, 0.5) << r << "x" << c;
      EXPECT_LT(s, 1.5) << r << "x" << c;
    }
  }
}

TEST(NewtonSchulz, CpuMatchesReference) {
  kernels::Context cpu(kernels::Backend::cpu), ref(kernels::Backend::reference);
  Tensor g = test::random_tensor({7, 33}, DType::f32, "g");
  Tensor a = test::poisoned({7, 33}, DType::f32), b = test::poisoned({7, 33}, DType::f32);
  newton_schulz(cpu, g, a, 5);
  newton_schulz(ref, g, b, 5);
  EXPECT_TRUE(test::normalized_close(a, b, 1e-4));
}

}  // namespace
}  // namespace moetron::optim
