// MoE routing and row movement at the bench-moe shape: 4096 tokens
// (micro-batch 8 x S 512), 8 experts, top-2, D 512. The kernels move memory
// and do little arithmetic, so the metric is bytes moved per second.
#include <string>

#include "bench_util.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/moe.h"

namespace moetron::bench {
namespace {

constexpr int64_t kTokens = 4096, kExperts = 8, kTopK = 2, kWidth = 512;

Tensor uniform(const Shape& shape, DType dt, const char* name) {
  Tensor t = Tensor::empty(shape, dt, MemTag::workspace);
  fill_uniform(t, 1, name, -1.0f, 1.0f);
  return t;
}

void record(Runner& runner, const std::string& name, const std::string& shape, DType dt,
            double seconds, double bytes) {
  runner.record({name,
                 {{"shape", shape}, {"dtype", std::string(dtype_name(dt))}},
                 {{"seconds", seconds}, {"gbytes_per_s", bytes / seconds * 1e-9}}});
}

void bench_router(Runner& runner) {
  using namespace kernels;
  Context ctx(Backend::cpu);
  const int64_t T = kTokens, E = kExperts, K = kTopK;
  Tensor logits = uniform({T, E}, DType::f32, "logits");
  Tensor scores = Tensor::empty({T, E}, DType::f32, MemTag::workspace);
  Tensor idx = Tensor::empty({T, K}, DType::i32, MemTag::workspace);
  Tensor w = Tensor::empty({T, K}, DType::f32, MemTag::workspace);
  Tensor dw = uniform({T, K}, DType::f32, "dw");
  Tensor dl = Tensor::empty({T, E}, DType::f32, MemTag::workspace);
  const RouterArgs args{static_cast<int>(K), RouterScore::softmax, true};
  const std::string shape = "[4096, 8] top-2 softmax";
  const double fwd =
      runner.time_median([&] { router_topk(ctx, logits, Tensor(), args, scores, idx, w); });
  // logits in, scores out, idx and weights out.
  record(runner, "moe/router_topk/fwd", shape, DType::f32, fwd, 4.0 * (2 * T * E + 2 * T * K));
  const double bwd = runner.time_median(
      [&] { router_topk_backward(ctx, dw, Tensor(), scores, idx, w, args, dl); });
  // dw, idx, weights and scores in, d_logits out.
  record(runner, "moe/router_topk/bwd", shape, DType::f32, bwd, 4.0 * (2 * T * E + 3 * T * K));
  record(runner, "moe/router_topk/fwd_bwd", shape, DType::f32, fwd + bwd,
         4.0 * (4 * T * E + 5 * T * K));
}

void bench_rows(Runner& runner) {
  using namespace kernels;
  Context ctx(Backend::cpu);
  const int64_t T = kTokens, E = kExperts, K = kTopK, D = kWidth;
  // A router's choice on random logits: roughly balanced experts.
  Tensor logits = uniform({T, E}, DType::f32, "logits");
  Tensor scores = Tensor::empty({T, E}, DType::f32, MemTag::workspace);
  Tensor idx = Tensor::empty({T, K}, DType::i32, MemTag::workspace);
  Tensor w = Tensor::empty({T, K}, DType::f32, MemTag::workspace);
  router_topk(ctx, logits, Tensor(), {static_cast<int>(K), RouterScore::softmax, true}, scores, idx,
              w);
  const MoePlan plan = moe_plan(idx, E, 0);
  const int64_t R = plan.rows();
  const double plan_s = runner.time_median([&] { (void)moe_plan(idx, E, 0); }, 0.2);
  runner.record({"moe/plan",
                 {{"shape", "[4096, 2] E=8 dropless"}, {"dtype", "i32"}},
                 {{"seconds", plan_s}, {"gbytes_per_s", 4.0 * (T * K * 3 + R) / plan_s * 1e-9}}});
  for (DType dt : {DType::f32, DType::bf16}) {
    const double es = static_cast<double>(dtype_size(dt));
    const std::string shape = "[4096, 512] top-2";
    Tensor x = uniform({T, D}, dt, "x");
    Tensor perm = Tensor::empty({R, D}, dt, MemTag::workspace);
    Tensor dperm = uniform({R, D}, dt, "dperm");
    Tensor dx = Tensor::empty({T, D}, dt, MemTag::workspace);
    Tensor out = Tensor::empty({T, D}, dt, MemTag::workspace);
    Tensor dout = uniform({T, D}, dt, "dout");
    Tensor deo = Tensor::empty({R, D}, dt, MemTag::workspace);
    Tensor dw = Tensor::empty({T, K}, DType::f32, MemTag::workspace);
    const double pf = runner.time_median([&] { moe_permute(ctx, x, plan, perm); });
    const double pb = runner.time_median([&] { moe_permute_backward(ctx, dperm, plan, dx); });
    const double uf = runner.time_median([&] { moe_unpermute(ctx, perm, plan, w, out); });
    const double ub =
        runner.time_median([&] { moe_unpermute_backward(ctx, dout, perm, plan, w, deo, dw); });
    // Bytes each kernel must touch once: rows read + rows written.
    record(runner, "moe/permute/fwd", shape, dt, pf, es * (R + R) * D);
    record(runner, "moe/permute/bwd", shape, dt, pb, es * (R + T) * D);
    record(runner, "moe/unpermute/fwd", shape, dt, uf, es * (R + T) * D);
    record(runner, "moe/unpermute/bwd", shape, dt, ub, es * (T + 2 * R) * D);
    record(runner, "moe/permute_unpermute/fwd_bwd", shape, dt, pf + pb + uf + ub,
           es * (6 * R + 3 * T) * D);
  }
}

void bench_moe(Runner& runner) {
  bench_router(runner);
  bench_rows(runner);
}

MOETRON_BENCH("moe", bench_moe);

}  // namespace
}  // namespace moetron::bench
