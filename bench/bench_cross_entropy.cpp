// Cross-entropy at the bench-moe shape: 4096 tokens (micro-batch 8 x S 512),
// vocab 8192, D 512. The fused version (LM head GEMM + log-softmax + the two
// backward GEMMs, chunk_tokens rows at a time) is measured forward+backward;
// gflops counts its three GEMMs (3 x 2 T V D). The plain version on
// precomputed logits is memory-bound: gbytes_per_s counts logits read once
// and dlogits written once.
#include <string>

#include "bench_util.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/cross_entropy.h"

namespace moetron::bench {
namespace {

constexpr int64_t kVocab = 8192, kWidth = 512;

Tensor uniform(const Shape& shape, DType dt, const char* name, float lo, float hi) {
  Tensor t = Tensor::empty(shape, dt, MemTag::workspace);
  fill_uniform(t, 1, name, lo, hi);
  return t;
}

Tensor random_targets(int64_t T, int64_t V) {
  Tensor t = Tensor::empty({T}, DType::i32, MemTag::workspace);
  PhiloxStream rng(1, "targets");
  for (int64_t i = 0; i < T; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % V);
  return t;
}

void bench_cross_entropy(Runner& runner) {
  using namespace kernels;
  Context ctx(Backend::cpu);
  // Quick mode (make demo) keeps V and D but runs 512 tokens.
  const int64_t T = runner.quick() ? 512 : 4096, V = kVocab, D = kWidth;
  const std::string shape_prefix = str_cat("T=", T, " V=8192");
  Tensor targets = random_targets(T, V);
  Tensor losses = Tensor::empty({T}, DType::f32, MemTag::workspace);
  const float scale = 1.0f / static_cast<float>(T);
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string dtype(dtype_name(dt));
    // Scaled so the logits have unit-ish spread, as a trained head's do.
    Tensor hidden = uniform({T, D}, dt, "hidden", -1.0f, 1.0f);
    Tensor head_w = uniform({V, D}, dt, "head_w", -0.08f, 0.08f);
    Tensor d_hidden = Tensor::empty({T, D}, dt, MemTag::workspace);
    Tensor d_head_w = Tensor::zeros({V, D}, DType::f32, MemTag::workspace);
    for (int64_t chunk : {512, 1024}) {
      const double s = runner.time_median(
          [&] {
            cross_entropy_fused(ctx, hidden, head_w, targets, scale, chunk, losses, d_hidden,
                                d_head_w);
          },
          1.0);
      const double flops = 3.0 * 2.0 * static_cast<double>(T) * V * D;
      runner.record({"cross_entropy/fused/fwd_bwd",
                     {{"shape", str_cat(shape_prefix, " D=512 chunk=", chunk)}, {"dtype", dtype}},
                     {{"seconds", s}, {"gflops", flops / s * 1e-9}, {"ms_per_step", s * 1e3}}});
    }
    Tensor logits = uniform({T, V}, dt, "logits", -4.0f, 4.0f);
    Tensor dlogits = Tensor::empty({T, V}, dt, MemTag::workspace);
    const double s =
        runner.time_median([&] { cross_entropy(ctx, logits, targets, scale, losses, dlogits); });
    const double bytes = 2.0 * static_cast<double>(T) * V * static_cast<double>(dtype_size(dt));
    runner.record({"cross_entropy/logits/fwd_bwd",
                   {{"shape", str_cat("[", T, ", 8192]")}, {"dtype", dtype}},
                   {{"seconds", s}, {"gbytes_per_s", bytes / s * 1e-9}, {"ms_per_step", s * 1e3}}});
  }
}

MOETRON_BENCH("cross_entropy", bench_cross_entropy);

}  // namespace
}  // namespace moetron::bench
