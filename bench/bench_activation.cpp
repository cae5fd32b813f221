// SwiGLU at the bench-moe expert shape (4096 tokens x top-2 = 8192 rows,
// expert hidden 1024, so gate_up [8192, 2048]) and the softmax over the
// vocabulary width [4096, 8192].
#include "moetron/kernels/activation.h"
#include "pointwise_bench.h"

namespace moetron::bench {
namespace {

void bench_activation(Runner& runner) {
  kernels::Context ctx(kernels::Backend::cpu, runner.threads());
  for (DType dt : {DType::f32, DType::bf16}) {
    const double es = static_cast<double>(dtype_size(dt));
    {
      const int64_t T = 8192, F = 1024;
      Tensor gu = bench_random({T, 2 * F}, dt, "gate_up", -4.0f, 4.0f);
      Tensor out = Tensor::empty({T, F}, dt);
      Tensor dout = bench_random({T, F}, dt, "dout");
      Tensor dgu = Tensor::empty({T, 2 * F}, dt);
      const double tf = static_cast<double>(T * F);
      // forward: read gate_up (2TF), write out (TF)
      time_bandwidth(runner, "activation/swiglu_fwd", "[8192, 2048]", dt, 3 * tf * es,
                     [&] { kernels::swiglu_forward(ctx, gu, out); });
      // backward: read dout (TF) and gate_up (2TF), write d_gate_up (2TF)
      time_bandwidth(runner, "activation/swiglu_bwd", "[8192, 2048]", dt, 5 * tf * es,
                     [&] { kernels::swiglu_backward(ctx, dout, gu, dgu); });
    }
    {
      // Quick mode keeps the width (the per-row work) and cuts the rows.
      const int64_t R = runner.quick() ? 512 : 4096, C = 8192;
      Tensor x = bench_random({R, C}, dt, "x", -8.0f, 8.0f);
      Tensor y = Tensor::empty({R, C}, dt);
      Tensor dy = bench_random({R, C}, dt, "dy");
      Tensor dx = Tensor::empty({R, C}, dt);
      const double rc = static_cast<double>(R * C);
      const std::string shape = str_cat("[", R, ", 8192]");
      // forward: read x, write y
      time_bandwidth(runner, "activation/softmax_fwd", shape, dt, 2 * rc * es,
                     [&] { kernels::softmax_forward(ctx, x, y); });
      // backward: read dy and y, write dx
      time_bandwidth(runner, "activation/softmax_bwd", shape, dt, 3 * rc * es,
                     [&] { kernels::softmax_backward(ctx, dy, y, dx); });
    }
  }
}

}  // namespace
MOETRON_BENCH("activation", bench_activation);
}  // namespace moetron::bench
