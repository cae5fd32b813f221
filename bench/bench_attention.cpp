// Attention forward + backward on the CPU backend, against the raw bf16
// GEMM rate of this machine measured in the same run by a oneDNN matmul.
//
// FLOP convention: only visible (query, key) pairs count (causal ~S^2/2,
// sliding window ~S (w + g)), 2 * head_dim FLOPs per pair per GEMM; the
// forward is 2 GEMMs (S = Q K^T, O = P V) = 4 hd per pair, the backward 5
// (S recomputed, dP = dO V^T, dV, dK, dQ) = 10 hd per pair. Softmax/exp
// work and the masked halves of boundary tiles are not counted.
// ratio = attention gflops / matmul gflops (target >= 0.25 for bf16).
#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "bench_util.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/attention.h"

namespace moetron::bench {
namespace {

using kernels::AttentionMask;

// bf16 [M x K] x [K x N] -> f32 with oneDNN, primitive created once; the
// weights are reordered once into the layout oneDNN prefers, so this is the
// best GEMM rate the library reaches here.
class MatmulProbe {
 public:
  static constexpr int64_t M = 4096, K = 512, N = 512;

  MatmulProbe()
      : a_(Tensor::empty({M, K}, DType::bf16, MemTag::workspace)),
        b_(Tensor::empty({K, N}, DType::bf16, MemTag::workspace)),
        c_(Tensor::empty({M, N}, DType::f32, MemTag::workspace)) {
    using dnnl::memory;
    fill_uniform(a_, 7, "mm_a", -1.0f, 1.0f);
    fill_uniform(b_, 7, "mm_b", -1.0f, 1.0f);
    const memory::desc a_md({M, K}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc b_plain({K, N}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc b_any({K, N}, memory::data_type::bf16, memory::format_tag::any);
    const memory::desc c_md({M, N}, memory::data_type::f32, memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), eng_);
    prim_ = dnnl::matmul(pd);
    am_ = memory(a_md, eng_, a_.raw());
    cm_ = memory(c_md, eng_, c_.raw());
    bm_ = memory(pd.weights_desc(), eng_);
    memory bp(b_plain, eng_, b_.raw());
    dnnl::reorder(bp, bm_).execute(stream_, bp, bm_);
    stream_.wait();
  }

  double gflops(const Runner& runner) {
    const double sec = runner.time_median(
        [&] {
          prim_.execute(stream_,
                        {{DNNL_ARG_SRC, am_}, {DNNL_ARG_WEIGHTS, bm_}, {DNNL_ARG_DST, cm_}});
          stream_.wait();
        },
        0.3);
    return 2.0 * M * K * N / sec * 1e-9;
  }

 private:
  dnnl::engine eng_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{eng_};
  Tensor a_, b_, c_;
  dnnl::matmul prim_;
  dnnl::memory am_, bm_, cm_;
};

// Visible (query, key) pairs of one head.
double visible_pairs(const AttentionMask& m, int64_t Sq, int64_t Sk) {
  double n = 0;
  for (int64_t i = 0; i < Sq; ++i)
    for (int64_t j = 0; j < Sk; ++j) n += kernels::attention_visible(m, i, j) ? 1 : 0;
  return n;
}

struct Shape4 {
  int64_t B, S, H, hd;
};

// The machine may be shared, so the GEMM rate is measured right before and
// right after the case and averaged: the ratio compares like with like.
void run_case(Runner& runner, kernels::Context& ctx, MatmulProbe& mm, const std::string& name,
              Shape4 s, const AttentionMask& mask, DType dt) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  auto make = [&](const char* what) {
    Tensor t = Tensor::empty({s.B, s.S, s.H, s.hd}, dt, MemTag::workspace);
    fill_uniform(t, 11, what, -1.0f, 1.0f);
    return t;
  };
  Tensor q = make("q"), k = make("k"), v = make("v"), dout = make("dout");
  Tensor out = Tensor::empty(q.shape(), dt, MemTag::workspace);
  Tensor lse = Tensor::empty({s.B, s.H, s.S}, DType::f32, MemTag::workspace);
  Tensor dq = Tensor::empty(q.shape(), dt, MemTag::workspace);
  Tensor dk = Tensor::empty(q.shape(), dt, MemTag::workspace);
  Tensor dv = Tensor::empty(q.shape(), dt, MemTag::workspace);
  auto fwd = [&] { kernels::attention_forward(ctx, q, k, v, mask, scale, out, lse); };
  auto bwd = [&] {
    kernels::attention_backward(ctx, dout, q, k, v, out, lse, mask, scale, dq, dk, dv);
  };
  fwd();
  const double min_s = runner.quick() ? 0.0 : 1.0;
  const double mm_before = mm.gflops(runner);
  const double t_fwd = runner.time_median(fwd, min_s);
  const double t_bwd = runner.time_median(bwd, min_s);
  const double mm_gflops = 0.5 * (mm_before + mm.gflops(runner));
  const double pairs = visible_pairs(mask, s.S, s.S) * static_cast<double>(s.B * s.H);
  const double f_fwd = 4.0 * s.hd * pairs, f_bwd = 10.0 * s.hd * pairs;
  const double gflops = (f_fwd + f_bwd) / (t_fwd + t_bwd) * 1e-9;
  // str_cat rather than std::string operator+: GCC 12 raises a false
  // -Wrestrict on chained string concatenation.
  const std::string shape = str_cat("B", s.B, " S", s.S, " H", s.H, " hd", s.hd);
  const std::string mask_str = mask.window > 0 ? str_cat(mask.causal ? "causal" : "full", " w",
                                                         mask.window, " g", mask.num_global)
                                               : std::string(mask.causal ? "causal" : "full");
  runner.record({str_cat("attention/", name, "/", dtype_name(dt)),
                 {{"shape", shape}, {"mask", mask_str}, {"dtype", std::string(dtype_name(dt))}},
                 {{"seconds", t_fwd + t_bwd},
                  {"fwd_seconds", t_fwd},
                  {"bwd_seconds", t_bwd},
                  {"fwd_gflops", f_fwd / t_fwd * 1e-9},
                  {"bwd_gflops", f_bwd / t_bwd * 1e-9},
                  {"gflops", gflops},
                  {"matmul_gflops", mm_gflops},
                  {"ratio", gflops / mm_gflops}}});
}

void bench_attention(Runner& runner) {
  kernels::Context ctx(kernels::Backend::cpu);
  MatmulProbe mm;
  runner.record({"attention/matmul_reference/bf16",
                 {{"shape", "4096x512x512"}, {"dtype", "bf16->f32"}},
                 {{"gflops", mm.gflops(runner)}}});
  AttentionMask causal;
  AttentionMask window;
  window.window = 512;
  window.num_global = 16;
  // Quick mode (make demo) keeps the bench-moe S 512 case at a smaller batch
  // and shortens the long-sequence cases to S 1024; bf16 only.
  const bool quick = runner.quick();
  const Shape4 short_seq = quick ? Shape4{2, 512, 8, 64} : Shape4{8, 512, 8, 64};
  const Shape4 long_seq = quick ? Shape4{1, 1024, 8, 64} : Shape4{1, 4096, 8, 64};
  if (quick) window.window = 256;
  for (DType dt : {DType::bf16, DType::f32}) {
    if (quick && dt == DType::f32) continue;
    run_case(runner, ctx, mm, str_cat("fwd_bwd_causal_s", short_seq.S), short_seq, causal, dt);
    run_case(runner, ctx, mm, str_cat("fwd_bwd_causal_s", long_seq.S), long_seq, causal, dt);
  }
  run_case(runner, ctx, mm, str_cat("fwd_bwd_window_s", long_seq.S), long_seq, window, DType::bf16);
}

MOETRON_BENCH("attention", bench_attention);

}  // namespace
}  // namespace moetron::bench
