// AdamW over 16M parameters (about one bench-moe layer's experts): f32
// master/m/v, f32 or bf16 grads, with and without a bf16 working copy.
#include "moetron/kernels/adamw.h"
#include "pointwise_bench.h"

namespace moetron::bench {
namespace {

void bench_adamw(Runner& runner) {
  const int64_t n = runner.quick() ? (int64_t{1} << 22) : (int64_t{1} << 24);
  kernels::Context ctx(kernels::Backend::cpu, runner.threads());
  Tensor w = Tensor::empty({n}, DType::f32), m = Tensor::zeros({n}, DType::f32);
  Tensor v = Tensor::zeros({n}, DType::f32);
  w.fill(0.5);
  const std::string shape = str_cat("[", n, "]");
  struct Case {
    DType grad;
    bool copy;
  };
  for (const Case c : {Case{DType::f32, false}, Case{DType::f32, true}, Case{DType::bf16, true}}) {
    Tensor g = bench_random({n}, c.grad, "grad");
    Tensor copy = c.copy ? Tensor::empty({n}, DType::bf16) : Tensor();
    kernels::AdamWArgs args;
    args.weight_decay = 0.1f;
    // read master, m, v, grad; write master, m, v (and the bf16 copy)
    const double bytes = static_cast<double>(n) *
                         (24.0 + static_cast<double>(dtype_size(c.grad)) + (c.copy ? 2.0 : 0.0));
    time_bandwidth(runner, c.copy ? "adamw/step_bf16_copy" : "adamw/step", shape, c.grad, bytes,
                   [&] {
                     kernels::adamw_step(ctx, w, g, m, v, args, copy);
                     ++args.step;
                   });
  }
}

}  // namespace
MOETRON_BENCH("adamw", bench_adamw);
}  // namespace moetron::bench
