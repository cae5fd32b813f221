// Reference cross-entropy: plain loops in double, the oracle. The fused
// version computes exactly what cross_entropy on hidden head_w^T would; the
// chunking only bounds the CPU's memory, so the reference ignores it.
#include <cmath>
#include <vector>

#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/cross_entropy_checks.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

using ce_detail::describe;

namespace {

void check_float(const Tensor& t, const char* fn, const char* name) {
  MOETRON_CHECK(!t.defined() || is_floating(t.dtype()), fn, ": ", name,
                " must be a float tensor, got ", describe(t));
}

// Loss of one row of logits z; with grad, overwrites z with grad_scale (softmax(z) - onehot) into
// it.
double softmax_xent(std::vector<double>& z, int64_t target, double grad_scale, bool grad) {
  if (target < 0) {
    if (grad) std::fill(z.begin(), z.end(), 0.0);
    return 0;
  }
  double mx = -INFINITY;
  for (double v : z) mx = std::max(mx, v);
  double sum = 0;
  for (double v : z) sum += std::exp(v - mx);
  const double loss = mx + std::log(sum) - z[static_cast<size_t>(target)];
  if (grad) {
    for (double& v : z) v = grad_scale * std::exp(v - mx) / sum;
    z[static_cast<size_t>(target)] -= grad_scale;
  }
  return loss;
}

}  // namespace

void cross_entropy(Context&, const Tensor& logits, const Tensor& targets, float grad_scale,
                   const Tensor& losses, const Tensor& dlogits) {
  const char* fn = "cross_entropy";
  ce_detail::check_logits(fn, logits, dlogits);
  check_float(logits, fn, "logits");
  check_float(losses, fn, "losses");
  check_float(dlogits, fn, "dlogits");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  ce_detail::check_targets(fn, targets, losses, T, V);
  const int32_t* tg = targets.data<int32_t>();
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t t = 0; t < T; ++t) {
    // The row is read whole before dlogits is written: dlogits may alias logits.
    for (int64_t v = 0; v < V; ++v) z[static_cast<size_t>(v)] = load(logits, t * V + v);
    store(losses, t, softmax_xent(z, tg[t], grad_scale, dlogits.defined()));
    if (dlogits.defined()) {
      for (int64_t v = 0; v < V; ++v) store(dlogits, t * V + v, z[static_cast<size_t>(v)]);
    }
  }
}

void cross_entropy_fused(Context&, const Tensor& hidden, const Tensor& head_w,
                         const Tensor& targets, float grad_scale, int64_t chunk_tokens,
                         const Tensor& losses, const Tensor& d_hidden, const Tensor& d_head_w) {
  const char* fn = "cross_entropy_fused";
  ce_detail::check_fused(fn, hidden, head_w, chunk_tokens, d_hidden, d_head_w);
  check_float(hidden, fn, "hidden");
  check_float(losses, fn, "losses");
  check_float(d_hidden, fn, "d_hidden");
  check_float(d_head_w, fn, "d_head_w");
  const int64_t T = hidden.dim(0), D = hidden.dim(1), V = head_w.dim(0);
  ce_detail::check_targets(fn, targets, losses, T, V);
  const int32_t* tg = targets.data<int32_t>();
  const bool grad = d_hidden.defined() || d_head_w.defined();
  const std::vector<double> h = load_all(hidden), w = load_all(head_w);
  // d_head_w's sum over tokens in double, rounded into it once at the end.
  std::vector<double> dw(d_head_w.defined() ? static_cast<size_t>(V * D) : 0, 0.0);
  std::vector<double> z(static_cast<size_t>(V)), dh(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    const double* ht = h.data() + t * D;
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += ht[d] * w[static_cast<size_t>(v * D + d)];
      z[static_cast<size_t>(v)] = acc;
    }
    store(losses, t, softmax_xent(z, tg[t], grad_scale, grad));
    if (!grad) continue;
    std::fill(dh.begin(), dh.end(), 0.0);
    for (int64_t v = 0; v < V; ++v) {
      const double g = z[static_cast<size_t>(v)];
      for (int64_t d = 0; d < D; ++d) {
        dh[static_cast<size_t>(d)] += g * w[static_cast<size_t>(v * D + d)];
        if (d_head_w.defined()) dw[static_cast<size_t>(v * D + d)] += g * ht[d];
      }
    }
    if (d_hidden.defined()) {
      for (int64_t d = 0; d < D; ++d) store(d_hidden, t * D + d, dh[static_cast<size_t>(d)]);
    }
  }
  if (d_head_w.defined()) {
    for (int64_t i = 0; i < V * D; ++i)
      store(d_head_w, i, load(d_head_w, i) + dw[static_cast<size_t>(i)]);
  }
}

}  // namespace moetron::kernels::reference
