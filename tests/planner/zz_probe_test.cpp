#include <gtest/gtest.h>
#include <chrono>
#include <cstdio>
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/matmul.h"
namespace moetron {
TEST(Probe, Gemm) {
  kernels::Context ctx(kernels::Backend::cpu, 1);
  struct S {
    int64_t m, k, n;
    int copies;
  };
  for (S s : {S{2048, 256, 256, 1}, S{2048, 256, 256, 64}, S{2048, 256, 1024, 1},
              S{2048, 256, 1024, 32}, S{1024, 256, 1024, 1}, S{1024, 256, 1024, 32},
              S{2048, 256, 4096, 1}, S{2048, 256, 4096, 8}, S{4096, 1024, 1024, 1}}) {
    std::vector<Tensor> as, bs, cs;
    for (int i = 0; i < s.copies; ++i) {
      as.push_back(Tensor::zeros({s.m, s.k}, DType::bf16, MemTag::workspace));
      as.back().fill(0.5);
      bs.push_back(Tensor::zeros({s.k, s.n}, DType::bf16, MemTag::workspace));
      bs.back().fill(0.25);
      cs.push_back(Tensor::zeros({s.m, s.n}, DType::bf16, MemTag::workspace));
    }
    for (int i = 0; i < s.copies; ++i) kernels::matmul(ctx, as[i], bs[i], cs[i], {});
    const int reps = std::max(3, 96 / s.copies);
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r)
      for (int i = 0; i < s.copies; ++i) kernels::matmul(ctx, as[i], bs[i], cs[i], {});
    const double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
        (reps * s.copies);
    std::printf("%lld x %lld x %lld copies %d: %.1f GFLOP/s\n", (long long)s.m, (long long)s.k,
                (long long)s.n, s.copies, 2.0 * s.m * s.k * s.n / sec / 1e9);
  }
}
}  // namespace moetron
