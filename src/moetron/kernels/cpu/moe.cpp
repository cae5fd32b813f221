// CPU MoE routing and row movement. Every output element is produced by one
// thread in a fixed order, so results do not depend on the thread count.

#include <cmath>
#include <cstring>
#include <limits>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/row_io.h"
#include "moetron/kernels/cpu/vec_math.h"
#include "moetron/kernels/moe.h"
#include "moetron/kernels/moe_checks.h"

namespace moetron::kernels::cpu {

using moe_detail::check_2d;
using moe_detail::describe;
using row_io::load16;
using row_io::load16_or;
using row_io::store16;

namespace {

// Parallelise only when there is enough work to pay for waking the pool.
constexpr int64_t kParallelElements = 16384;

void check_f32(const Tensor& t, const char* fn, const char* name) {
  MOETRON_CHECK(t.defined() && t.dtype() == DType::f32, fn, ": ", name,
                " must be f32 on the CPU backend, got ", describe(t));
}

void check_row_dtype(const Tensor& t, const char* fn) {
  MOETRON_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, fn,
                ": the CPU backend moves f32 or bf16 rows, got ", t.str());
}

template <typename Fn>
void dispatch_rows(DType dt, Fn&& fn) {
  if (dt == DType::f32) {
    fn(float{});
  } else {
    fn(bf16{});
  }
}

// scores[0, E) = softmax or sigmoid of x[0, E), 16 lanes at a time.
void score_row(const float* x, int64_t E, RouterScore score, float* s) {
  const simd::vf neg_inf = simd::set1(-std::numeric_limits<float>::infinity());
  if (score == RouterScore::sigmoid) {
    const simd::vf one = simd::set1(1.0f);
    for (int64_t e = 0; e < E; e += 16) {
      const simd::vf v = load16(x + e, E - e);
      store16(s + e, simd::div(one, simd::add(one, exp16(simd::sub(simd::zero(), v)))), E - e);
    }
    return;
  }
  simd::vf mx = neg_inf;
  for (int64_t e = 0; e < E; e += 16) {
    mx = simd::max(mx, load16_or(x + e, E - e, neg_inf));
  }
  const simd::vf m = simd::set1(simd::reduce_max(mx));
  simd::vf sum = simd::zero();
  for (int64_t e = 0; e < E; e += 16) {
    // Masked-off lanes read -inf, whose exp is 0, so they add nothing.
    const simd::vf p = exp16(simd::sub(load16_or(x + e, E - e, neg_inf), m));
    sum = simd::add(sum, p);
    store16(s + e, p, E - e);
  }
  const simd::vf total = simd::set1(simd::reduce_add(sum));
  for (int64_t e = 0; e < E; e += 16) {
    store16(s + e, simd::div(load16(s + e, E - e), total), E - e);
  }
}

}  // namespace

void router_topk(Context&, const Tensor& logits, const Tensor& bias, const RouterArgs& args,
                 const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_weight) {
  const char* fn = "router_topk";
  moe_detail::check_router_topk_args(fn, check_f32, logits, bias, scores, topk_idx, topk_weight,
                                     args);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t K = args.k;
  const float* px = ptr<float>(logits);
  const float* pb = bias.defined() ? ptr<float>(bias) : nullptr;
  float* ps = ptr<float>(scores);
  int32_t* pi = ptr<int32_t>(topk_idx);
  float* pw = ptr<float>(topk_weight);
#pragma omp parallel if (T * E > kParallelElements)
  {
    std::vector<float> val(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* s = ps + t * E;
      score_row(px + t * E, E, args.score, s);
      // Insertion into a descending list of K; strict '>' keeps the earlier
      // (lower) expert ahead on ties, as the reference's repeated argmax does.
      int32_t* id = pi + t * K;
      int64_t n = 0;
      for (int64_t e = 0; e < E; ++e) {
        const float v = s[e] + (pb ? pb[e] : 0.0f);
        if (n == K && !(v > val[static_cast<size_t>(K - 1)])) continue;
        int64_t p = n < K ? n : K - 1;
        while (p > 0 && v > val[static_cast<size_t>(p - 1)]) {
          val[static_cast<size_t>(p)] = val[static_cast<size_t>(p - 1)];
          id[p] = id[p - 1];
          --p;
        }
        val[static_cast<size_t>(p)] = v;
        id[p] = static_cast<int32_t>(e);
        if (n < K) ++n;
      }
      float chosen_sum = 0;
      for (int64_t k = 0; k < K; ++k) chosen_sum += s[id[k]];
      for (int64_t k = 0; k < K; ++k)
        pw[t * K + k] = args.renormalize ? s[id[k]] / chosen_sum : s[id[k]];
    }
  }
}

void router_topk_backward(Context&, const Tensor& d_topk_weight, const Tensor& d_scores_extra,
                          const Tensor& scores, const Tensor& topk_idx, const Tensor& topk_weight,
                          const RouterArgs& args, const Tensor& d_logits) {
  const char* fn = "router_topk_backward";
  moe_detail::check_router_backward_args(fn, check_f32, d_topk_weight, d_scores_extra, scores,
                                         topk_idx, topk_weight, args, d_logits);
  const int64_t T = scores.dim(0), E = scores.dim(1), K = args.k;
  const int32_t* pi = ptr<int32_t>(topk_idx);
  for (int64_t i = 0; i < T * K; ++i) {
    MOETRON_CHECK(pi[i] >= 0 && pi[i] < E, fn, ": topk_idx entry ", pi[i], " outside [0, ", E, ")");
  }
  const float* ps = ptr<float>(scores);
  const float* pw = ptr<float>(topk_weight);
  const float* pg = d_topk_weight.defined() ? ptr<float>(d_topk_weight) : nullptr;
  const float* px = d_scores_extra.defined() ? ptr<float>(d_scores_extra) : nullptr;
  float* pd = ptr<float>(d_logits);
  // E is small (8 to a few hundred): scalar loops per row, rows in parallel.
#pragma omp parallel for schedule(static) if (T * E > kParallelElements)
  for (int64_t t = 0; t < T; ++t) {
    const float* s = ps + t * E;
    float* ds = pd + t * E;  // d_scores built in place, then mapped through the Jacobian
    for (int64_t e = 0; e < E; ++e) ds[e] = px ? px[t * E + e] : 0.0f;
    if (pg) {
      float chosen_sum = 0, g_dot_w = 0;
      for (int64_t k = 0; k < K; ++k) {
        chosen_sum += s[pi[t * K + k]];
        g_dot_w += pg[t * K + k] * pw[t * K + k];
      }
      for (int64_t k = 0; k < K; ++k) {
        const float g = pg[t * K + k];
        ds[pi[t * K + k]] += args.renormalize ? (g - g_dot_w) / chosen_sum : g;
      }
    }
    if (args.score == RouterScore::softmax) {
      float s_dot_ds = 0;
      for (int64_t e = 0; e < E; ++e) s_dot_ds += s[e] * ds[e];
      for (int64_t e = 0; e < E; ++e) ds[e] = s[e] * (ds[e] - s_dot_ds);
    } else {
      for (int64_t e = 0; e < E; ++e) ds[e] = ds[e] * s[e] * (1.0f - s[e]);
    }
  }
}

void moe_permute(Context&, const Tensor& x, const MoePlan& plan, const Tensor& permuted) {
  moe_detail::check_rows("moe_permute", plan, x, "x", permuted, "permuted");
  check_row_dtype(x, "moe_permute");
  const int64_t D = x.dim(1), rows = plan.rows();
  const size_t row_bytes = static_cast<size_t>(D) * x.element_size();
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(permuted.raw());
  const int32_t* tok = plan.token_of_row.data();
#pragma omp parallel for schedule(static) if (rows * D > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                src + static_cast<size_t>(tok[r]) * row_bytes, row_bytes);
  }
}

void moe_permute_backward(Context&, const Tensor& d_permuted, const MoePlan& plan,
                          const Tensor& dx) {
  moe_detail::check_rows("moe_permute_backward", plan, dx, "dx", d_permuted, "d_permuted");
  check_row_dtype(dx, "moe_permute_backward");
  const int64_t D = dx.dim(1), K = plan.top_k, T = plan.num_tokens;
  const int32_t* slot = plan.row_of_slot.data();
  dispatch_rows(dx.dtype(), [&](auto tag) {
    using T_ = decltype(tag);
    const T_* src = ptr<T_>(d_permuted);
    T_* dst = ptr<T_>(dx);
#pragma omp parallel for schedule(static) if (T * D > kParallelElements)
    for (int64_t t = 0; t < T; ++t) {
      T_* out = dst + t * D;
      const int32_t* rows = slot + t * K;
      for (int64_t d = 0; d < D; d += 16) {
        // Slots in k order: a fixed summation order whatever the threads.
        simd::vf acc = simd::zero();
        for (int64_t k = 0; k < K; ++k) {
          if (rows[k] >= 0) acc = simd::add(acc, load16(src + rows[k] * D + d, D - d));
        }
        store16(out + d, acc, D - d);
      }
    }
  });
}

void moe_unpermute(Context&, const Tensor& expert_out, const MoePlan& plan,
                   const Tensor& topk_weight, const Tensor& out) {
  const char* fn = "moe_unpermute";
  moe_detail::check_rows(fn, plan, out, "out", expert_out, "expert_out");
  moe_detail::check_weights(fn, plan, topk_weight, "topk_weight");
  check_row_dtype(out, fn);
  check_f32(topk_weight, fn, "topk_weight");
  const int64_t D = out.dim(1), K = plan.top_k, T = plan.num_tokens;
  const int32_t* slot = plan.row_of_slot.data();
  const float* pw = ptr<float>(topk_weight);
  dispatch_rows(out.dtype(), [&](auto tag) {
    using T_ = decltype(tag);
    const T_* src = ptr<T_>(expert_out);
    T_* dst = ptr<T_>(out);
#pragma omp parallel for schedule(static) if (T * D > kParallelElements)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* rows = slot + t * K;
      for (int64_t d = 0; d < D; d += 16) {
        simd::vf acc = simd::zero();
        for (int64_t k = 0; k < K; ++k) {
          if (rows[k] < 0) continue;
          acc = simd::fmadd(simd::set1(pw[t * K + k]), load16(src + rows[k] * D + d, D - d), acc);
        }
        store16(dst + t * D + d, acc, D - d);
      }
    }
  });
}

void moe_unpermute_backward(Context&, const Tensor& dout, const Tensor& expert_out,
                            const MoePlan& plan, const Tensor& topk_weight,
                            const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  const char* fn = "moe_unpermute_backward";
  moe_detail::check_rows(fn, plan, dout, "dout", expert_out, "expert_out");
  moe_detail::check_weights(fn, plan, topk_weight, "topk_weight");
  check_row_dtype(dout, fn);
  check_f32(topk_weight, fn, "topk_weight");
  if (d_expert_out.defined())
    moe_detail::check_rows(fn, plan, dout, "dout", d_expert_out, "d_expert_out");
  if (d_topk_weight.defined()) {
    moe_detail::check_weights(fn, plan, d_topk_weight, "d_topk_weight");
    check_f32(d_topk_weight, fn, "d_topk_weight");
  }
  const int64_t D = dout.dim(1), K = plan.top_k, T = plan.num_tokens;
  const int32_t* slot = plan.row_of_slot.data();
  const float* pw = ptr<float>(topk_weight);
  float* pdw = d_topk_weight.defined() ? ptr<float>(d_topk_weight) : nullptr;
  dispatch_rows(dout.dtype(), [&](auto tag) {
    using T_ = decltype(tag);
    const T_* g = ptr<T_>(dout);
    const T_* e_out = ptr<T_>(expert_out);
    T_* de = d_expert_out.defined() ? ptr<T_>(d_expert_out) : nullptr;
    // Each kept slot owns one permuted row, so the writes never collide.
#pragma omp parallel for schedule(static) if (T * D > kParallelElements)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = slot[t * K + k];
        if (r < 0) {
          if (pdw) pdw[t * K + k] = 0.0f;
          continue;
        }
        const simd::vf w = simd::set1(pw[t * K + k]);
        simd::vf dot = simd::zero();
        for (int64_t d = 0; d < D; d += 16) {
          const simd::vf gv = load16(g + t * D + d, D - d);
          if (pdw) dot = simd::fmadd(gv, load16(e_out + r * D + d, D - d), dot);
          if (de) store16(de + r * D + d, simd::mul(w, gv), D - d);
        }
        if (pdw) pdw[t * K + k] = simd::reduce_add(dot);
      }
    }
  });
}
void moe_combine_weight_grad(Context&, const Tensor& act, const MoePlan& plan,
                             const Tensor& topk_weight, const Tensor& d_act,
                             const Tensor& d_expert_out, const Tensor& d_topk_weight) {
  const char* fn = "moe_combine_weight_grad";
  moe_detail::check_combine_weight_grad(fn, plan, act, topk_weight, d_act, d_expert_out,
                                        d_topk_weight);
  check_row_dtype(act, fn);
  check_f32(topk_weight, fn, "topk_weight");
  check_f32(d_topk_weight, fn, "d_topk_weight");
  const int64_t F = act.dim(1), K = plan.top_k, T = plan.num_tokens;
  const int64_t D = d_expert_out.defined() ? d_expert_out.dim(1) : 0;
  const int32_t* slot = plan.row_of_slot.data();
  const float* pw = ptr<float>(topk_weight);
  float* pdw = ptr<float>(d_topk_weight);
  dispatch_rows(act.dtype(), [&](auto tag) {
    using T_ = decltype(tag);
    const T_* a = ptr<T_>(act);
    T_* da = ptr<T_>(d_act);
    T_* de = d_expert_out.defined() ? ptr<T_>(d_expert_out) : nullptr;
    // Each kept slot owns one row, so the in-place writes never collide.
#pragma omp parallel for schedule(static) if (T * F > kParallelElements)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r = slot[t * K + k];
        if (r < 0) {
          pdw[t * K + k] = 0.0f;
          continue;
        }
        const simd::vf w = simd::set1(pw[t * K + k]);
        simd::vf dot = simd::zero();
        for (int64_t f = 0; f < F; f += 16) {
          const simd::vf g = load16(da + r * F + f, F - f);
          dot = simd::fmadd(g, load16(a + r * F + f, F - f), dot);
          store16(da + r * F + f, simd::mul(w, g), F - f);
        }
        for (int64_t d = 0; d < D; d += 16)
          store16(de + r * D + d, simd::mul(w, load16(de + r * D + d, D - d)), D - d);
        pdw[t * K + k] = simd::reduce_add(dot);
      }
    }
  });
}

}  // namespace moetron::kernels::cpu
