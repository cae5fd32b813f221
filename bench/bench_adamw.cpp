// AdamW over 16M parameters (about one bench-moe layer's experts): f32
// master/m/v, f32 or bf16 grads, with and without a bf16 working copy; and
// the memory modes of issue 24 §3: a bf16 master (stochastically rounded)
// with bf16 moments, 8-bit moments, and 8-bit m with a factored v.
#include "moetron/kernels/adamw.h"
#include "moetron/kernels/quantized_state.h"
#include "moetron/kernels/stochastic_round.h"
#include "pointwise_bench.h"

namespace moetron::bench {
namespace {

// bf16 master and grads; moments bf16, 8-bit, or 8-bit m with v factored
// over a [n / 4096, 4096] matrix. Bytes: what each must read and write
// (codes 1 B each way, scales and factors negligible; the factored step
// reads the gradient twice more for its row and column means).
void bench_low_memory_modes(Runner& runner, kernels::Context& ctx, int64_t n) {
  const std::string shape = str_cat("[", n, "]");
  Tensor w = Tensor::empty({n}, DType::bf16);
  w.fill(0.5);
  const Tensor g = bench_random({n}, DType::bf16, "grad");
  Tensor m16 = Tensor::zeros({n}, DType::bf16), v16 = Tensor::zeros({n}, DType::bf16);
  using kernels::StateCode;
  const kernels::QuantizedState m8 =
      kernels::zero_quantized_state(n, StateCode::signed_e4m3, MemTag::workspace);
  const kernels::QuantizedState v8 =
      kernels::zero_quantized_state(n, StateCode::unsigned_e4m4, MemTag::workspace);
  const int64_t cols = 4096;
  const kernels::FactoredMoment vf{Tensor::zeros({n / cols}, DType::f32),
                                   Tensor::zeros({cols}, DType::f32)};
  kernels::AdamWArgs args;
  args.weight_decay = 0.1f;
  const auto keyed = [&] {
    args.rounding_key = kernels::rounding_key(1, "w", ++args.step);
    return kernels::rounding_key(1, "m", args.step);
  };
  time_bandwidth(runner, "adamw/step_bf16_master", shape, DType::bf16,
                 14.0 * static_cast<double>(n), [&] {
                   keyed();
                   kernels::adamw_step(ctx, w, g, m16, v16, args, Tensor());
                 });
  time_bandwidth(runner, "adamw/step_q8", shape, DType::bf16, 10.0 * static_cast<double>(n), [&] {
    const uint32_t key = keyed();
    kernels::adamw_step_q8(ctx, w, g, m8, v8, args, key, key + 1, Tensor());
  });
  time_bandwidth(runner, "adamw/step_q8_factored", shape, DType::bf16,
                 12.0 * static_cast<double>(n), [&] {
                   const uint32_t key = keyed();
                   kernels::adamw_step_q8_factored(ctx, w, g, m8, vf, args, key, Tensor());
                 });
}

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
  bench_low_memory_modes(runner, ctx, n);
}

}  // namespace
MOETRON_BENCH("adamw", bench_adamw);
}  // namespace moetron::bench
