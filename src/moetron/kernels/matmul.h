// Dense and grouped (per-expert) matrix multiplication.
//
// Dtypes: a and b both f32 or both bf16 (the reference also takes f64);
// c f32 or bf16 (reference: also f64). Accumulation is fp32 (fp64 in the
// reference). Tensors are contiguous row-major.
#pragma once

#include <cstdint>
#include <span>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

struct MatmulArgs {
  bool trans_a = false;  // a is stored [..., K, M]
  bool trans_b = false;  // b is stored [..., N, K] (the [out, in] layout of weights)
  float alpha = 1.0f;
  float beta = 0.0f;  // c = alpha * op(a) op(b) + beta * c; beta != 0 reads c
};

// a: [..., M, K] (or [..., K, M]); b: [..., K, N] (or [..., N, K]) with the
// same leading batch dims as a, or 2-D and shared by every batch; c: [..., M, N].
MOETRON_KERNEL_DECL_CUDA(void matmul(Context& ctx, const Tensor& a, const Tensor& b,
                                     const Tensor& c, const MatmulArgs& args))

// Row-grouped GEMM for experts. x: [T, K] whose rows [offsets[e], offsets[e+1])
// belong to group e (offsets has E+1 entries, offsets[0] = 0, offsets[E] <= T);
// w: [E, N, K] if trans_w (weights stored [out, in]) else [E, K, N];
// y: [T, N], rows of group e = x_e op(w_e) + beta * y_e. Rows past offsets[E]
// are not touched.
MOETRON_KERNEL_DECL(void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w,
                                        std::span<const int64_t> offsets, const Tensor& y,
                                        bool trans_w, float beta))

// Weight gradient of grouped_matmul with trans_w: dw[e] = beta * dw[e] + dy_e^T x_e,
// dy: [T, N], x: [T, K], dw: [E, N, K] (f32 or bf16 — bf16: fp32 sums,
// rounded once into dw —, or the reference's f64).
// A group with no rows gives beta * dw[e].
MOETRON_KERNEL_DECL(void grouped_matmul_weight_grad(Context& ctx, const Tensor& dy, const Tensor& x,
                                                    std::span<const int64_t> offsets,
                                                    const Tensor& dw, float beta))

// Whether the CPU backend widens bf16 GEMM operands to fp32 on this machine
// (oneDNN has no bf16 matmul without AVX512_CORE): its contexts then keep
// fp32 scratch as large as the largest GEMM's operands (planner/gemm_scratch.h).
bool cpu_widens_bf16_matmul();

// The fp32 slots the CPU backend's GEMMs keep in their context
// (kernels/cpu/cpu_state.h), in elements, for one c[m, n] = a[m, k] b[k, n]
// with a and b of `ab` and c of `c`: bf16 operands widened where oneDNN has
// no bf16 matmul (`widens`: cpu_widens_bf16_matmul()) take a slot each, and
// an fp32 GEMM into bf16 (a widened one included) is computed into the
// third first. A slot keeps the largest request it has seen, so after a
// step each holds the maximum over the step's GEMMs.
struct GemmSlots {
  int64_t staged_out = 0, widened_a = 0, widened_b = 0;
};
GemmSlots cpu_gemm_slots(int64_t m, int64_t n, int64_t k, DType ab, DType c, bool widens);

}  // namespace moetron::kernels
