#include "moetron/planner/gemm_scratch.h"

#include <algorithm>

#include "moetron/planner/memory_model.h"

namespace moetron::planner {
namespace {

struct Slots {
  GemmScratch s;
  bool bf16_grads = false;
  bool widens = false;  // kernels::cpu_widens_bf16_matmul(), as the inputs say
  // One GEMM c[m, n] = a[m, k] b[k, n] on bf16 operands into bf16 (bf16_out)
  // or f32: the slots the CPU matmul requests for it (kernels/matmul.h).
  void gemm(int64_t m, int64_t n, int64_t k, bool bf16_out) {
    const kernels::GemmSlots g =
        kernels::cpu_gemm_slots(m, n, k, DType::bf16, bf16_out ? DType::bf16 : DType::f32, widens);
    s.widened_a = std::max(s.widened_a, g.widened_a);
    s.widened_b = std::max(s.widened_b, g.widened_b);
    s.staged_out = std::max(s.staged_out, g.staged_out);
  }
  // nn/linear.cpp over `rows` tokens: y = x w^T, dw += dy^T x, dx = dy w.
  // Activations and their gradients are bf16; the weight gradient is bf16
  // only with train.grad_dtype = bf16.
  void linear(int64_t rows, int64_t in, int64_t out, bool hidden_matrix = true) {
    gemm(rows, out, in, true);
    gemm(out, in, rows, bf16_grads && hidden_matrix);
    gemm(rows, in, out, true);
  }
};

}  // namespace

GemmScratch widened_gemm_scratch(const MemoryInputs& in, const Dims& x,
                                 const std::vector<std::pair<int64_t, int64_t>>& chunks,
                                 bool last_stage) {
  if (x.c != DType::bf16) return {};
  Slots sl;
  sl.bf16_grads = in.matrix_grad == DType::bf16;
  sl.widens = in.widened_bf16_gemm;
  const nn::MoeConfig& e = in.moe;
  for (const auto& [lo, hi] : chunks) {
    for (int64_t i = lo; i < hi; ++i) {
      // Attention: q, k, v column-parallel and o row-parallel over all t
      // tokens (sequence parallelism gathers them first).
      sl.linear(x.t, x.d, x.h * x.hd);
      sl.linear(x.t, x.d, x.hkv * x.hd);
      sl.linear(x.t, x.h * x.hd, x.d);
      if (!nn::layer_is_moe(e, i)) {
        sl.linear(x.t, x.d, 2 * x.ffn);  // the fused gate-up
        sl.linear(x.t, x.ffn, x.d);
        continue;
      }
      if (x.shared_hidden > 0) {  // shared experts on the MoE layer's tm tokens
        sl.linear(x.tm, x.d, 2 * x.shared_hidden);
        sl.linear(x.tm, x.shared_hidden, x.d);
      }
      // Routed experts: one GEMM per local expert on its rows (balanced
      // routing, as for the activations): gate-up, down, and their backward.
      const int64_t local = std::max<int64_t>(x.e / x.ep, 1);
      const int64_t rows = (x.rows_expert + local - 1) / local;
      sl.gemm(rows, 2 * x.f, x.d, true);
      sl.gemm(rows, x.d, x.f, true);
      sl.gemm(rows, x.f, x.d, true);               // d_act = d_out w2
      sl.gemm(x.d, x.f, rows, sl.bf16_grads);      // dw2 = d_out^T act
      sl.gemm(2 * x.f, x.d, rows, sl.bf16_grads);  // dw13 = d_gate_up^T x
      sl.gemm(rows, x.d, 2 * x.f, true);           // d_x = d_gate_up w13
    }
  }
  if (last_stage) {
    // The fused cross-entropy per chunk (kernels/cpu/cross_entropy.cpp and
    // nn/vocab_parallel_ce.cpp): logits = h w^T into fp32, d_hidden = dlogits
    // w from bf16 dlogits; the head's weight gradient is an fp32 GEMM.
    const int64_t chunk = std::min(in.ce_chunk_tokens, x.t);
    sl.gemm(chunk, x.v, x.d, false);
    sl.gemm(chunk, x.d, x.v, true);
  }
  return sl.s;
}

}  // namespace moetron::planner
