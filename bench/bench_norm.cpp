// RMSNorm forward and backward at the bench-moe shape: 4096 tokens x D 512.
#include "moetron/kernels/norm.h"
#include "pointwise_bench.h"

namespace moetron::bench {
namespace {

void bench_rmsnorm(Runner& runner) {
  const int64_t T = 4096, D = 512;
  kernels::Context ctx(kernels::Backend::cpu, runner.threads());
  for (DType dt : {DType::f32, DType::bf16}) {
    const double es = static_cast<double>(dtype_size(dt));
    Tensor x = bench_random({T, D}, dt, "x");
    Tensor w = bench_random({D}, DType::f32, "w", 0.5f, 1.5f);
    Tensor y = Tensor::empty({T, D}, dt), rstd = Tensor::empty({T}, DType::f32);
    Tensor dy = bench_random({T, D}, dt, "dy");
    Tensor dx = Tensor::empty({T, D}, dt), dw = Tensor::zeros({D}, DType::f32);
    const double td = static_cast<double>(T * D);
    // forward: read x and w, write y and rstd
    time_bandwidth(runner, "norm/rmsnorm_fwd", "[4096, 512]", dt, 2 * td * es + 4.0 * (D + T),
                   [&] { kernels::rmsnorm_forward(ctx, x, w, 1e-5f, y, rstd); });
    // backward: read dy, x, w, rstd, dw; write dx and dw
    time_bandwidth(runner, "norm/rmsnorm_bwd", "[4096, 512]", dt, 3 * td * es + 4.0 * (3 * D + T),
                   [&] { kernels::rmsnorm_backward(ctx, dy, x, w, rstd, dx, dw); });
  }
}

}  // namespace
MOETRON_BENCH("norm", bench_rmsnorm);
}  // namespace moetron::bench
