// Each compressor round-trips within its stated bound on awkward sizes, and
// error feedback telescopes: over T steps, what was sent plus the final
// residual equals the sum of the true gradients.
#include "moetron/parallel/grad_compressor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"

namespace moetron::parallel {
namespace {

std::vector<float> randn(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  PhiloxStream rng(seed, "compressor");
  for (auto& x : v) {
    // Box-Muller from two uniforms.
    const double u1 = 1.0 - static_cast<double>(rng.next_uniform()), u2 = rng.next_uniform();
    x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  if (n > 3) v[3] = 0.0f;  // an exact zero
  return v;
}

std::vector<float> round_trip(const CompressOptions& o, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> enc(static_cast<size_t>(encoded_bytes(o, n)));
  encode(o, x.data(), n, enc.data());
  std::vector<float> y(x.size(), 0.0f);
  decode_add(o, enc.data(), n, y.data());
  return y;
}

TEST(GradCompressor, BlockQuantisationErrorIsAtMostHalfAStep) {
  for (const CompressKind kind : {CompressKind::int8, CompressKind::int4}) {
    for (const int64_t n : {1, 7, 255, 256, 1000}) {
      CompressOptions o;
      o.kind = kind;
      o.block = 64;
      const auto x = randn(n, static_cast<uint64_t>(n));
      const auto y = round_trip(o, x);
      const float qmax = kind == CompressKind::int8 ? 127.0f : 7.0f;
      for (int64_t b = 0; b * o.block < n; ++b) {
        float mx = 0;
        for (int64_t i = b * o.block; i < std::min(n, (b + 1) * o.block); ++i)
          mx = std::max(mx, std::fabs(x[static_cast<size_t>(i)]));
        for (int64_t i = b * o.block; i < std::min(n, (b + 1) * o.block); ++i) {
          EXPECT_LE(std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]),
                    0.5f * mx / qmax * 1.0001f + 1e-7f)
              << compress_kind_name(kind) << " n " << n << " i " << i;
        }
      }
    }
  }
}

TEST(GradCompressor, SignKeepsSignsAndEachBlocksMeanMagnitude) {
  CompressOptions o;
  o.kind = CompressKind::sign;
  o.block = 100;
  for (const int64_t n : {1, 9, 100, 333}) {
    const auto x = randn(n, 40 + static_cast<uint64_t>(n));
    const auto y = round_trip(o, x);
    for (int64_t b = 0; b * o.block < n; ++b) {
      double sx = 0, sy = 0;
      const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
      for (int64_t i = lo; i < hi; ++i) {
        sx += std::fabs(x[static_cast<size_t>(i)]);
        sy += std::fabs(y[static_cast<size_t>(i)]);
        if (x[static_cast<size_t>(i)] != 0) {
          EXPECT_EQ(std::signbit(x[static_cast<size_t>(i)]),
                    std::signbit(y[static_cast<size_t>(i)]));
        }
      }
      EXPECT_NEAR(sx, sy, 1e-4 * sx + 1e-6) << "n " << n << " block " << b;
    }
    EXPECT_EQ(encoded_bytes(o, n), (n + 7) / 8 + 4 * ((n + 99) / 100));
  }
}

TEST(GradCompressor, TopKKeepsTheLargestExactlyAndDropsOnlySmallerOnes) {
  CompressOptions o;
  o.kind = CompressKind::topk;
  o.topk_ratio = 0.05;
  for (const int64_t n : {1, 20, 999}) {
    const auto x = randn(n, 70 + static_cast<uint64_t>(n));
    const auto y = round_trip(o, x);
    const auto k = static_cast<int64_t>(std::ceil(0.05 * static_cast<double>(n)));
    int64_t kept = 0;
    float smallest_kept = INFINITY, largest_dropped = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
      if (yi != 0) {
        EXPECT_EQ(xi, yi);
        ++kept;
        smallest_kept = std::min(smallest_kept, std::fabs(xi));
      } else {
        largest_dropped = std::max(largest_dropped, std::fabs(xi));
      }
    }
    EXPECT_EQ(kept, k) << n;
    EXPECT_LE(largest_dropped, smallest_kept) << n;
  }
}

TEST(GradCompressor, SparseSignSendsTheLargestBlocksAsSignsAndDropsTheRest) {
  CompressOptions o;
  o.kind = CompressKind::sparse_sign;
  o.block = 16;
  o.keep = 0.5;
  for (const int64_t n : {1, 15, 16, 100, 517}) {
    auto x = randn(n, 90 + static_cast<uint64_t>(n));
    // Blocks 4x larger each, so which are kept is known: the last ones.
    for (int64_t i = 0; i < n; ++i)
      x[static_cast<size_t>(i)] *= std::ldexp(1.0f, 2 * static_cast<int>(i / 16));
    const auto y = round_trip(o, x);
    const int64_t nb = (n + 15) / 16,
                  k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(0.5 * nb)));
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t lo = b * 16, hi = std::min(n, lo + 16);
      const bool kept = b >= nb - k;
      double sx = 0, sy = 0;
      for (int64_t i = lo; i < hi; ++i) {
        const float xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
        sx += std::fabs(xi);
        sy += std::fabs(yi);
        if (!kept) {
          EXPECT_EQ(yi, 0.0f) << "n " << n << " dropped block " << b;
        } else if (xi != 0) {
          EXPECT_EQ(std::signbit(xi), std::signbit(yi)) << "n " << n << " i " << i;
        }
      }
      if (kept) {
        EXPECT_NEAR(sx, sy, 1e-4 * sx + 1e-6) << "n " << n << " block " << b;
      }
    }
    EXPECT_EQ(encoded_bytes(o, n), (nb + 7) / 8 + k * (4 + 2)) << n;
  }
  // Under one bit per value at the default keep and block.
  CompressOptions d;
  d.kind = CompressKind::sparse_sign;
  const int64_t big = 1 << 20;
  EXPECT_LT(8.0 * static_cast<double>(encoded_bytes(d, big)) / big, 0.85);
  EXPECT_THROW(parse_compress_kind("sparse"), Error);
  EXPECT_EQ(parse_compress_kind("sparse_sign"), CompressKind::sparse_sign);
}

TEST(GradCompressor, ErrorFeedbackSentPlusResidualEqualsTheTrueSum) {
  for (const CompressKind kind :
       {CompressKind::int4, CompressKind::sign, CompressKind::topk, CompressKind::sparse_sign}) {
    CompressOptions o;
    o.kind = kind;
    o.block = 32;
    o.topk_ratio = 0.02;
    const int64_t n = 517;
    std::vector<double> true_sum(static_cast<size_t>(n), 0), sent_sum(static_cast<size_t>(n), 0);
    std::vector<float> residual(static_cast<size_t>(n), 0.0f);
    for (int t = 0; t < 40; ++t) {
      auto g = randn(n, 1000 + static_cast<uint64_t>(t));
      std::vector<float> v(g.size());
      for (int64_t i = 0; i < n; ++i) {
        true_sum[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
        v[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] + residual[static_cast<size_t>(i)];
      }
      const auto s = round_trip(o, v);
      for (int64_t i = 0; i < n; ++i) {
        sent_sum[static_cast<size_t>(i)] += s[static_cast<size_t>(i)];
        residual[static_cast<size_t>(i)] = v[static_cast<size_t>(i)] - s[static_cast<size_t>(i)];
      }
    }
    double worst = 0, res_norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(
          worst, std::fabs(sent_sum[static_cast<size_t>(i)] + residual[static_cast<size_t>(i)] -
                           true_sum[static_cast<size_t>(i)]));
      res_norm =
          std::max(res_norm, std::fabs(static_cast<double>(residual[static_cast<size_t>(i)])));
    }
    EXPECT_LE(worst, 1e-4) << compress_kind_name(kind);  // float rounding over 40 steps only
    // And feedback keeps the residual bounded instead of letting it grow with T.
    EXPECT_LT(res_norm, 40.0) << compress_kind_name(kind);
  }
}

}  // namespace
}  // namespace moetron::parallel
