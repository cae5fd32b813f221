#include "moetron/kernels/moe.h"
#include "moetron/kernels/f16_staging.h"

namespace moetron::kernels {

void router_topk(Context& ctx, const Tensor& logits, const Tensor& bias, const RouterArgs& args,
                 const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_weight) {
  MOETRON_KERNEL_DISPATCH(ctx, router_topk, logits, bias, args, scores, topk_idx, topk_weight);
}
void router_topk_backward(Context& ctx, const Tensor& d_topk_weight, const Tensor& d_scores_extra,
                          const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_weight,
                          const RouterArgs& args, const Tensor& d_logits) {
  MOETRON_KERNEL_DISPATCH(ctx, router_topk_backward, d_topk_weight, d_scores_extra, scores,
                          topk_idx, topk_weight, args, d_logits);
}
void moe_permute(Context& ctx, const Tensor& x, const MoePlan& plan, const Tensor& permuted) {
  if (needs_f16_staging(ctx, {&x, &permuted})) {
    return run_f16_staged(ctx, "moe_permute", [&](F16Staging& s) {
      cpu::moe_permute(ctx, s.in(x), plan, s.out(permuted, true));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, moe_permute, x, plan, permuted);
}
void moe_permute_backward(Context& ctx, const Tensor& d_permuted, const MoePlan& plan,
                          const Tensor& dx) {
  if (needs_f16_staging(ctx, {&d_permuted, &dx})) {
    return run_f16_staged(ctx, "moe_permute_backward", [&](F16Staging& s) {
      cpu::moe_permute_backward(ctx, s.in(d_permuted), plan, s.out(dx));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, moe_permute_backward, d_permuted, plan, dx);
}
void moe_unpermute(Context& ctx, const Tensor& expert_out, const MoePlan& plan,
                   const Tensor& topk_weight, const Tensor& out) {
  if (needs_f16_staging(ctx, {&expert_out, &out})) {
    return run_f16_staged(ctx, "moe_unpermute", [&](F16Staging& s) {
      cpu::moe_unpermute(ctx, s.in(expert_out), plan, topk_weight, s.out(out));
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, moe_unpermute, expert_out, plan, topk_weight, out);
}
void moe_unpermute_backward(Context& ctx, const Tensor& dout, const Tensor& expert_out,
                            const MoePlan& plan, const Tensor& topk_weight,
                            const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  if (needs_f16_staging(ctx, {&dout, &expert_out, &d_expert_out})) {
    return run_f16_staged(ctx, "moe_unpermute_backward", [&](F16Staging& s) {
      cpu::moe_unpermute_backward(ctx, s.in(dout), s.in(expert_out), plan, topk_weight,
                                  s.out(d_expert_out, true), d_topk_weight);
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, moe_unpermute_backward, dout, expert_out, plan, topk_weight,
                          d_expert_out, d_topk_weight);
}
void moe_combine_weight_grad(Context& ctx, const Tensor& act, const MoePlan& plan,
                             const Tensor& topk_weight, const Tensor& d_act,
                             const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  if (needs_f16_staging(ctx, {&act, &d_act, &d_expert_out})) {
    return run_f16_staged(ctx, "moe_combine_weight_grad", [&](F16Staging& s) {
      cpu::moe_combine_weight_grad(ctx, s.in(act), plan, topk_weight, s.out(d_act, true),
                                   d_expert_out.defined() ? s.out(d_expert_out, true) : Tensor(),
                                   d_topk_weight);
    });
  }
  MOETRON_KERNEL_DISPATCH(ctx, moe_combine_weight_grad, act, plan, topk_weight, d_act, d_expert_out,
                          d_topk_weight);
}

}  // namespace moetron::kernels
