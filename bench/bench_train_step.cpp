// bench-moe training step (family "train_step"): tokens/s, MFU against the
// measured matmul peak of the same dtype in the same run, peak bytes per
// allocator tag, and the step's time split by kernel group.
#include <chrono>
#include <map>

#include "bench_util.h"
#include "moetron/core/allocator.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/flops.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"

namespace moetron::bench {
namespace {

using clock_type = std::chrono::steady_clock;

// The best GEMM rate of the model's own shapes: the honest MFU denominator.
double matmul_peak(Runner& runner, kernels::Context& ctx, DType dt) {
  double best = 0;
  for (auto [m, n, k] :
       {std::array<int64_t, 3>{4096, 512, 512}, {1024, 2048, 512}, {4096, 8192, 512}}) {
    Tensor a = Tensor::empty({m, k}, dt, MemTag::workspace),
           b = Tensor::empty({n, k}, dt, MemTag::workspace);
    Tensor c = Tensor::empty({m, n}, DType::f32, MemTag::workspace);
    fill_uniform(a, 1, "a", -1, 1);
    fill_uniform(b, 1, "b", -1, 1);
    kernels::MatmulArgs args;
    args.trans_b = true;
    const double s = runner.time_median([&] { kernels::matmul(ctx, a, b, c, args); }, 0.3);
    best = std::max(best, 2.0 * static_cast<double>(m * n * k) / s);
  }
  return best;
}

std::string group_of(const std::string& fn) {
  if (fn == "matmul" || fn.rfind("grouped_matmul", 0) == 0) return "gemm";
  if (fn.rfind("attention", 0) == 0) return "attention";
  if (fn.rfind("router", 0) == 0 || fn.rfind("moe_", 0) == 0) return "moe_route_permute";
  if (fn.rfind("cross_entropy", 0) == 0) return "cross_entropy";
  if (fn == "adamw_step") return "optimizer";
  return "norm_elementwise";  // rmsnorm, swiglu, rope, add, convert, embedding, sum_squares ...
}

void bench_step(Runner& runner, bool bf16) {
  nn::ModelConfig m;
  m.vocab_size = 8192;
  m.d_model = 512;
  m.n_layers = runner.quick() ? 2 : 8;
  m.n_heads = 8;
  m.n_kv_heads = 8;
  m.max_seq_len = 512;
  nn::MoeConfig e;
  e.num_experts = 8;
  e.top_k = 2;
  e.expert_hidden = 1024;
  const int64_t batch = runner.quick() ? 2 : 8, seq = 512;
  kernels::Context ctx(kernels::Backend::cpu, runner.threads());
  const DType dt = bf16 ? DType::bf16 : DType::f32;
  const double peak = matmul_peak(runner, ctx, dt);

  Allocator& alloc = cpu_allocator();
  alloc.reset_peaks();
  nn::Transformer model(m, e, bf16 ? nn::Precision::bf16() : nn::Precision::fp32());
  model.initialize(1);
  optim::OptimizerOptions oo;
  oo.schedule = {1e-3, 0.1, 0, 100};
  optim::Optimizer opt(model.params(), oo);
  Tensor in = Tensor::empty({batch, seq}, DType::i32),
         tgt = Tensor::empty({batch, seq}, DType::i32);
  PhiloxStream rng(3, "tokens");
  for (int64_t i = 0; i < batch * seq; ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % 8192);
    tgt.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % 8192);
  }
  int64_t step = 0;
  auto train_step = [&] {
    model.params().zero_grads();
    model.forward_backward(ctx, in, tgt, 1.0 / static_cast<double>(batch * seq), 1.0, true);
    opt.step(ctx, ++step);
  };
  train_step();  // warm-up: primitive creation, first-touch of buffers
  ctx.profile().reset();
  ctx.profile().enabled = true;
  const int reps = runner.quick() ? 1 : 3;
  double total = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    train_step();
    total += std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  ctx.profile().enabled = false;
  const double secs = total / reps;
  const double tokens = static_cast<double>(batch * seq);
  const double fpt = nn::model_flops_per_token(m, e, seq);
  Result res;
  res.name = std::string("train_step/bench-moe/") + (bf16 ? "bf16" : "f32");
  res.labels["layers"] = std::to_string(m.n_layers);
  res.labels["tokens"] = std::to_string(batch * seq);
  res.metrics["seconds"] = secs;
  res.metrics["tokens_per_s"] = tokens / secs;
  res.metrics["model_gflop_per_token"] = fpt / 1e9;
  res.metrics["matmul_peak_gflops"] = peak / 1e9;
  res.metrics["mfu"] = tokens / secs * fpt / peak;
  const MemStats st = alloc.stats();
  for (int t = 0; t < kNumMemTags; ++t) {
    res.metrics[std::string("peak_mb_") + std::string(mem_tag_name(static_cast<MemTag>(t)))] =
        static_cast<double>(st.peak[static_cast<size_t>(t)]) / 1e6;
  }
  res.metrics["peak_mb_total"] = static_cast<double>(st.total_peak) / 1e6;
  std::map<std::string, double> groups;
  double counted = 0;
  for (const auto& [fn, s] : ctx.profile().seconds()) {
    groups[group_of(fn)] += s / reps;
    counted += s / reps;
    res.metrics["ms_" + fn] = 1e3 * s / reps;
  }
  for (const auto& [g, s] : groups) res.metrics["frac_" + g] = s / secs;
  res.metrics["frac_other"] = std::max(0.0, secs - counted) / secs;
  runner.record(res);
}

}  // namespace

MOETRON_BENCH("train_step", [](Runner& r) {
  bench_step(r, true);
  bench_step(r, false);
});

}  // namespace moetron::bench
