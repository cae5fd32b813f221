#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, float grad_scale,
                   const Tensor& losses, const Tensor& dlogits) {
  if (needs_f16_staging(ctx, {&logits, &dlogits})) {
    return run_f16_staged(ctx, "cross_entropy", [&](F16Staging& s) {
      cpu::cross_entropy(ctx, s.in(logits), targets, grad_scale, losses, s.out(dlogits));
    });
  }
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, cross_entropy, logits, targets, grad_scale, losses, dlogits);
}
void cross_entropy_fused(Context& ctx, const Tensor& hidden, const Tensor& head_w,
                         const Tensor& targets, float grad_scale, int64_t chunk_tokens,
                         const Tensor& losses, const Tensor& d_hidden, const Tensor& d_head_w) {
  if (needs_f16_staging(ctx, {&hidden, &head_w, &d_hidden})) {
    return run_f16_staged(ctx, "cross_entropy_fused", [&](F16Staging& s) {
      cpu::cross_entropy_fused(ctx, s.in(hidden), s.in(head_w), targets, grad_scale, chunk_tokens,
                               losses, s.out(d_hidden), d_head_w);
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, cross_entropy_fused, hidden, head_w, targets, grad_scale,
                          chunk_tokens, losses, d_hidden, d_head_w);
}

Scratch cross_entropy_fused_scratch(Backend backend, const CrossEntropyFusedShape& shape) {
  const int64_t nh = shape.tokens * shape.dim, nw = shape.vocab * shape.dim;
  CrossEntropyFusedShape kernel = shape;
  if (shape.dtype == DType::f16) kernel.dtype = DType::f32;
  return call_scratch("cross_entropy_fused_scratch", backend, shape.dtype == DType::f16,
                      {nh, nw, shape.d_hidden ? nh : 0},
                      [&] { return cpu::cross_entropy_fused_scratch(kernel); });
}

}  // namespace moetron::kernels
