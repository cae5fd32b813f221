#include "moetron/kernels/vocab_parallel_ce.h"

namespace moetron::kernels {

void vocab_parallel_ce_max(Context& ctx, const Tensor& logits, const Tensor& row_max) {
  MOETRON_KERNEL_DISPATCH(ctx, vocab_parallel_ce_max, logits, row_max);
}

void vocab_parallel_ce_exp_sum(Context& ctx, const Tensor& logits, const Tensor& row_max,
                               const Tensor& targets, int64_t offset, const Tensor& stats) {
  MOETRON_KERNEL_DISPATCH(ctx, vocab_parallel_ce_exp_sum, logits, row_max, targets, offset, stats);
}

void vocab_parallel_ce_loss(Context& ctx, const Tensor& stats, const Tensor& targets,
                            const Tensor& losses) {
  MOETRON_KERNEL_DISPATCH(ctx, vocab_parallel_ce_loss, stats, targets, losses);
}

void vocab_parallel_ce_grad(Context& ctx, const Tensor& exps, const Tensor& stats,
                            const Tensor& targets, int64_t offset, float grad_scale) {
  MOETRON_KERNEL_DISPATCH(ctx, vocab_parallel_ce_grad, exps, stats, targets, offset, grad_scale);
}

}  // namespace moetron::kernels
