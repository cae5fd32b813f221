#include "moetron/nn/vocab_parallel_ce.h"

#include <algorithm>
#include <cmath>

#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"

namespace moetron::nn {

void vocab_parallel_cross_entropy(kernels::Context& ctx, const TensorParallel& tp, const Tensor& hidden,
                                  const Tensor& head_w, const Tensor& targets, float grad_scale,
                                  int64_t chunk_tokens, const Tensor& losses, const Tensor& d_hidden,
                                  const Tensor& d_head_w) {
  MOETRON_CHECK(tp.group && tp.group->size() == tp.size, "vocab-parallel cross-entropy without its tp group");
  MOETRON_CHECK(hidden.dtype() == DType::f32 || hidden.dtype() == DType::bf16 || hidden.dtype() == DType::f16,
                "vocab-parallel cross-entropy takes f32, bf16 or f16 hidden states, got ", hidden.str());
  MOETRON_CHECK(losses.dtype() == DType::f32, "vocab-parallel cross-entropy losses must be f32");
  const int64_t t = hidden.dim(0), d = hidden.dim(1), v = head_w.dim(0);
  const int64_t offset = tp.rank * v;
  const bool grads = d_hidden.defined();
  const int32_t* tgt = targets.data<int32_t>();
  float* loss = losses.data<float>();
  const int64_t chunk = std::max<int64_t>(1, std::min(chunk_tokens, t));
  for (int64_t c0 = 0; c0 < t; c0 += chunk) {
    const int64_t c = std::min(chunk, t - c0);
    const Tensor h = hidden.slice(c0, c0 + c);
    Tensor logits = Tensor::empty({c, v}, DType::f32, MemTag::workspace);
    kernels::MatmulArgs fwd;
    fwd.trans_b = true;
    kernels::matmul(ctx, h, head_w, logits, fwd);
    float* lg = logits.data<float>();
    Tensor mx = Tensor::empty({c}, DType::f32, MemTag::workspace);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i) mx.data<float>()[i] = *std::max_element(lg + i * v, lg + (i + 1) * v);
    tp.group->allreduce(mx, comm::ReduceOp::max);
    // [sum of exp(logit - max) over this rank's vocabulary; the target's logit if here]
    Tensor sums = Tensor::zeros({c, 2}, DType::f32, MemTag::workspace);
    float* sm = sums.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i) {
      const float m = mx.data<float>()[i];
      const int64_t local = tgt[c0 + i] - offset;
      if (tgt[c0 + i] >= 0 && local >= 0 && local < v) sm[2 * i + 1] = lg[i * v + local] - m;
      float s = 0;
      for (int64_t j = 0; j < v; ++j) {
        lg[i * v + j] = std::exp(lg[i * v + j] - m);  // kept for the gradient
        s += lg[i * v + j];
      }
      sm[2 * i] = s;
    }
    tp.group->allreduce(sums, comm::ReduceOp::sum);
    for (int64_t i = 0; i < c; ++i) {
      // log(sum exp(l - m)) - (l_target - m)
      loss[c0 + i] = tgt[c0 + i] < 0 ? 0.0f : std::log(sm[2 * i]) - sm[2 * i + 1];
    }
    if (!grads) continue;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i) {
      float* row = lg + i * v;
      if (tgt[c0 + i] < 0) {
        std::fill(row, row + v, 0.0f);
        continue;
      }
      const float inv = grad_scale / sm[2 * i];
      for (int64_t j = 0; j < v; ++j) row[j] *= inv;
      const int64_t local = tgt[c0 + i] - offset;
      if (local >= 0 && local < v) row[local] -= grad_scale;
    }
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
