// RoPE forward and backward at the bench-moe attention shape: 4096 tokens
// (micro-batch 8 x S 512), H 8, head_dim 64, positions 0..511 per sequence.
#include "moetron/kernels/rope.h"
#include "pointwise_bench.h"

namespace moetron::bench {
namespace {

void bench_rope(Runner& runner) {
  const int64_t T = 4096, H = 8, hd = 64, S = 512;
  kernels::Context ctx(kernels::Backend::cpu, runner.threads());
  Tensor pos = Tensor::empty({T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(t % S);
  for (DType dt : {DType::f32, DType::bf16}) {
    const double es = static_cast<double>(dtype_size(dt));
    Tensor x = bench_random({T, H, hd}, dt, "x");
    Tensor y = Tensor::empty({T, H, hd}, dt);
    const double bytes = 2.0 * static_cast<double>(T * H * hd) * es + 4.0 * T;  // read x, write y
    time_bandwidth(runner, "rope/rope_fwd", "[4096, 8, 64]", dt, bytes,
                   [&] { kernels::rope_forward(ctx, x, pos, 10000.0f, y); });
    time_bandwidth(runner, "rope/rope_bwd", "[4096, 8, 64]", dt, bytes,
                   [&] { kernels::rope_backward(ctx, y, pos, 10000.0f, x); });
  }
}

}  // namespace
MOETRON_BENCH("rope", bench_rope);
}  // namespace moetron::bench
