#include "moetron/nn/vocab_parallel_ce.h"

#include <algorithm>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/vocab_parallel_ce.h"

namespace moetron::nn {

void vocab_parallel_cross_entropy(kernels::Context& ctx, const TensorParallel& tp,
                                  const Tensor& hidden, const Tensor& head_w, const Tensor& targets,
                                  float grad_scale, int64_t chunk_tokens, const Tensor& losses,
                                  const Tensor& d_hidden, const Tensor& d_head_w) {
  MOETRON_CHECK(tp.group && tp.group->size() == tp.size,
                "vocab-parallel cross-entropy without its tp group");
  MOETRON_CHECK(
      hidden.dtype() == DType::f32 || hidden.dtype() == DType::bf16 || hidden.dtype() == DType::f16,
      "vocab-parallel cross-entropy takes f32, bf16 or f16 hidden states, got ", hidden.str());
  MOETRON_CHECK(losses.dtype() == DType::f32, "vocab-parallel cross-entropy losses must be f32");
  const int64_t t = hidden.dim(0), d = hidden.dim(1), v = head_w.dim(0);
  const int64_t offset = tp.rank * v;
  const bool grads = d_hidden.defined();
  const int64_t chunk = std::max<int64_t>(1, std::min(chunk_tokens, t));
  for (int64_t c0 = 0; c0 < t; c0 += chunk) {
    const int64_t c = std::min(chunk, t - c0);
    const Tensor h = hidden.slice(c0, c0 + c);
    Tensor logits = Tensor::empty({c, v}, DType::f32, MemTag::workspace);
    kernels::MatmulArgs fwd;
    fwd.trans_b = true;
    kernels::matmul(ctx, h, head_w, logits, fwd);
    // This rank's numeric steps are kernels (kernels/vocab_parallel_ce.h);
    // the two all-reduces between them combine the ranks' vocabulary slices.
    const Tensor tg = targets.slice(c0, c0 + c);
    Tensor mx = Tensor::empty({c}, DType::f32, MemTag::workspace);
    kernels::vocab_parallel_ce_max(ctx, logits, mx);
    tp.group->allreduce(mx, comm::ReduceOp::max);
    // [sum of exp(logit - max) over this rank's vocabulary; the target's logit if here]
    Tensor sums = Tensor::empty({c, 2}, DType::f32, MemTag::workspace);
    kernels::vocab_parallel_ce_exp_sum(ctx, logits, mx, tg, offset, sums);
    tp.group->allreduce(sums, comm::ReduceOp::sum);
    kernels::vocab_parallel_ce_loss(ctx, sums, tg, losses.slice(c0, c0 + c));
    if (!grads) continue;
    kernels::vocab_parallel_ce_grad(ctx, logits, sums, tg, offset, grad_scale);
    // d_head_w += dlogits^T h (fp32 dlogits); d_hidden = dlogits W, with
    // dlogits rounded to bf16 weights' dtype as the fused kernel does (f16
    // is staged through fp32 there, and by matmul here: fp32 dlogits).
    Tensor h32 = h;
    if (h.dtype() != DType::f32) {
      h32 = Tensor::empty({c, d}, DType::f32, MemTag::workspace);
      kernels::convert(ctx, h, h32);
    }
    kernels::MatmulArgs wgrad;
    wgrad.trans_a = true;
    wgrad.beta = 1.0f;
    kernels::matmul(ctx, logits, h32, d_head_w, wgrad);
    Tensor dl = logits;
    if (head_w.dtype() == DType::bf16) {
      dl = Tensor::empty({c, v}, head_w.dtype(), MemTag::workspace);
      kernels::convert(ctx, logits, dl);
    }
    kernels::matmul(ctx, dl, head_w, d_hidden.slice(c0, c0 + c), {});
  }
}

}  // namespace moetron::nn
