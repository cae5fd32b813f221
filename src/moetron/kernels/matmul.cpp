#include "moetron/kernels/matmul.h"
#include "moetron/kernels/cpu/matmul_gemm.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void matmul(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
            const MatmulArgs& args) {
  if (needs_f16_staging(ctx, {&a, &b, &c})) {
    return run_f16_staged(ctx, "matmul", [&](F16Staging& s) {
      cpu::matmul(ctx, s.in(a), s.in(b), s.out(c, args.beta != 0.0f), args);
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, matmul, a, b, c, args);
}
void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w,
                    std::span<const int64_t> offsets, const Tensor& y, bool trans_w, float beta) {
  if (needs_f16_staging(ctx, {&x, &w, &y})) {
    return run_f16_staged(ctx, "grouped_matmul", [&](F16Staging& s) {
      cpu::grouped_matmul(ctx, s.in(x), s.in(w), offsets, s.out(y, true), trans_w, beta);
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, grouped_matmul, x, w, offsets, y, trans_w, beta);
}
void grouped_matmul_weight_grad(Context& ctx, const Tensor& dy, const Tensor& x,
                                std::span<const int64_t> offsets, const Tensor& dw, float beta) {
  if (needs_f16_staging(ctx, {&dy, &x, &dw})) {
    return run_f16_staged(ctx, "grouped_matmul_weight_grad", [&](F16Staging& s) {
      cpu::grouped_matmul_weight_grad(ctx, s.in(dy), s.in(x), offsets, s.out(dw, beta != 0.0f),
                                      beta);
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, grouped_matmul_weight_grad, dy, x, offsets, dw, beta);
}

GemmSlots cpu_gemm_slots(int64_t m, int64_t n, int64_t k, DType ab, DType c, bool widens) {
  cpu::GemmSpec s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.ab = ab;
  s.c = c;
  return cpu::gemm_slots(s, widens);
}

bool cpu_widens_bf16_matmul() {
  static const bool widens = [] {
    Context ctx(Backend::cpu);  // a capability probe: the thread count stays
    return !cpu::has_native_bf16_matmul(ctx.cpu_state());
  }();
  return widens;
}

}  // namespace moetron::kernels
