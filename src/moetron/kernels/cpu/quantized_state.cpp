// 8-bit optimizer state on the CPU (codes: cpu/state_codes.h): blocks of
// kStateBlock values, OpenMP over blocks.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "moetron/kernels/cpu/adamw_factors.h"
#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/cpu/state_codes.h"
#include "moetron/kernels/cpu/stochastic_store.h"
#include "moetron/kernels/quantized_state.h"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::cpu {

void quantize_state(Context&, const Tensor& x, const QuantizedState& q, uint32_t key) {
  const float* px = ptr<float>(x);
  uint8_t* codes = ptr<uint8_t>(q.codes);
  float* scales = ptr<float>(q.scales);
  const int64_t n = x.numel(), blocks = state_scale_count(n);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t len = std::min(kStateBlock, n - b * kStateBlock);
    encode_block(q.code, px + b * kStateBlock, len, b, codes, scales, key);
  }
}

void dequantize_state(Context&, const QuantizedState& q, const Tensor& x) {
  const Table& t = table_of(q.code);
  const uint8_t* codes = ptr<uint8_t>(q.codes);
  const float* scales = ptr<float>(q.scales);
  float* px = ptr<float>(x);
  const int64_t n = x.numel(), blocks = state_scale_count(n);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t len = std::min(kStateBlock, n - b * kStateBlock);
    decode_block(t, codes + b * kStateBlock, scales[b], len, px + b * kStateBlock);
  }
}

namespace {

// m's codes; sqrt(v)'s codes, or (factored) sqrt(row_i / mean(row)) and
// sqrt(col_j) of a matrix with `cols` columns.
struct Q8Args {
  const QuantizedState& m;
  const QuantizedState* v;
  uint32_t m_key, v_key, w_key;
  const float* row_root = nullptr;
  const float* col_root = nullptr;
  int64_t cols = 0;
};

// One block: decode m and sqrt(v) (or form sqrt(v) from the factors),
// update in fp32 (adamw.h's formula), write the weights, re-encode the
// state. s holds sqrt(v) and is squared for the update; a frozen or
// factored v keeps s as it is (and its codes).
template <typename W, typename G, typename P>
void adamw_block(W* w, const G* grad, P* copy, int64_t b, int64_t len, const Factors& k,
                 const Q8Args& q) {
  alignas(64) float m[kStateBlock], s[kStateBlock];
  const int64_t base = b * kStateBlock;
  decode_block(table_of(q.m.code), ptr<uint8_t>(q.m.codes) + base, ptr<float>(q.m.scales)[b], len,
               m);
  const bool factored = q.row_root != nullptr;
  if (factored) {  // walk (row, col) from the block's first element: no division per element
    int64_t r = base / q.cols, c = base % q.cols;
    for (int64_t j = 0; j < len; ++j) {
      s[j] = q.row_root[r] * q.col_root[c];
      if (++c == q.cols) {
        c = 0;
        ++r;
      }
    }
  } else {
    decode_block(table_of(q.v->code), ptr<uint8_t>(q.v->codes) + base, ptr<float>(q.v->scales)[b],
                 len, s);
  }
  const bool keep_root = k.frozen || factored;
  for (int64_t j = 0; j < len; j += 16) {
    const simd::mask16 mk = lane_mask(len - j);
    const int64_t i = base + j;
    const simd::vf g = simd::mul(k.scale, load16(grad + i, mk));
    const simd::vf mi = simd::fmadd(k.b1, load16(m + j, mk), simd::mul(k.one_minus_b1, g));
    const simd::vf s_old = load16(s + j, mk);
    const simd::vf vi =
        simd::fmadd(k.b2, simd::mul(s_old, s_old), simd::mul(k.one_minus_b2, simd::mul(g, g)));
    const simd::vf root = keep_root ? s_old : simd::sqrt(vi);
    const simd::vf denom = simd::fmadd(root, k.inv_sqrt_bc2, k.eps);
    const simd::vf update = simd::div(simd::mul(mi, k.inv_bc1), denom);
    const simd::vf wi = load16(w + i, mk);
    const simd::vf w_new = simd::fnmadd(k.lr, update, simd::fnmadd(k.lr_wd, wi, wi));
    store16(m + j, mi, mk);
    store16(s + j, root, mk);
    if constexpr (std::is_same_v<W, bf16>) {
      store16_stochastic(w + i, w_new, len - j, q.w_key, i);
    } else {
      store16(w + i, w_new, mk);
    }
    if constexpr (!std::is_void_v<P>) store16(copy + i, w_new, mk);
  }
  encode_block(q.m.code, m, len, b, ptr<uint8_t>(q.m.codes), ptr<float>(q.m.scales), q.m_key);
  if (!keep_root)
    encode_block(q.v->code, s, len, b, ptr<uint8_t>(q.v->codes), ptr<float>(q.v->scales), q.v_key);
}

template <typename W, typename G, typename P>
void adamw_q8_loop(W* w, const G* grad, P* copy, int64_t n, const Factors& k, const Q8Args& q) {
  const int64_t blocks = state_scale_count(n);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t b = 0; b < blocks; ++b)
    adamw_block<W, G, P>(w, grad, copy, b, std::min(kStateBlock, n - b * kStateBlock), k, q);
}

}  // namespace

namespace {

template <typename G>
void run_q8(const Tensor& master, const G* g, const Tensor& param_copy, const Factors& k,
            const Q8Args& q) {
  const int64_t n = master.numel();
  if (master.dtype() == DType::bf16) {
    return adamw_q8_loop<bf16, G, void>(ptr<bf16>(master), g, nullptr, n, k, q);
  }
  if (!param_copy.defined()) {
    return adamw_q8_loop<float, G, void>(ptr<float>(master), g, nullptr, n, k, q);
  }
  dispatch_f32_bf16(param_copy.dtype(), "adamw_step_q8 param_copy", [&](auto ptag) {
    using P = decltype(ptag);
    adamw_q8_loop<float, G, P>(ptr<float>(master), g, ptr<P>(param_copy), n, k, q);
  });
}

inline float value_of(float x) {
  return x;
}
inline float value_of(bf16 x) {
  return bf16_to_f32(x.bits);
}

// row_i = b2 row_i + (1 - b2) mean_j (s g_ij)^2, col_j likewise: each mean
// summed in one fixed order (rows by row, columns by column chunk), so the
// result does not depend on the thread count.
template <typename G>
void update_factors(const G* g, float scale, double b2, const FactoredMoment& v) {
  const int64_t rows = v.row.numel(), cols = v.col.numel();
  float* row = ptr<float>(v.row);
  float* col = ptr<float>(v.col);
  const auto sq = [&](int64_t i, int64_t j) {
    const float gs = scale * value_of(g[i * cols + j]);
    return static_cast<double>(gs) * static_cast<double>(gs);
  };
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += sq(i, j);
    row[i] = static_cast<float>(b2 * row[i] + (1.0 - b2) * (sum / static_cast<double>(cols)));
  }
  constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c1 = std::min(cols, c0 + kChunk);
    double sums[kChunk] = {};
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = c0; j < c1; ++j) sums[j - c0] += sq(i, j);
    }
    for (int64_t j = c0; j < c1; ++j)
      col[j] =
          static_cast<float>(b2 * col[j] + (1.0 - b2) * (sums[j - c0] / static_cast<double>(rows)));
  }
}

}  // namespace

void adamw_step_q8(Context&, const Tensor& master, const Tensor& grad, const QuantizedState& m,
                   const QuantizedState& v, const AdamWArgs& args, uint32_t m_key, uint32_t v_key,
                   const Tensor& param_copy) {
  const Factors k = make_factors(args);
  const Q8Args q{m, &v, m_key, v_key, args.rounding_key};
  dispatch_f32_bf16(grad.dtype(), "adamw_step_q8 grad", [&](auto gtag) {
    using G = decltype(gtag);
    run_q8<G>(master, ptr<G>(grad), param_copy, k, q);
  });
}

void adamw_step_q8_factored(Context&, const Tensor& master, const Tensor& grad,
                            const QuantizedState& m, const FactoredMoment& v, const AdamWArgs& args,
                            uint32_t m_key, const Tensor& param_copy) {
  const Factors k = make_factors(args);
  const int64_t rows = v.row.numel(), cols = v.col.numel();
  dispatch_f32_bf16(grad.dtype(), "adamw_step_q8_factored grad", [&](auto gtag) {
    using G = decltype(gtag);
    if (!k.frozen) update_factors<G>(ptr<G>(grad), args.grad_scale, args.beta2, v);
    const float* row = ptr<float>(v.row);
    const float* col = ptr<float>(v.col);
    double mean = 0;
    for (int64_t i = 0; i < rows; ++i) mean += row[i];
    mean /= static_cast<double>(rows);
    const double inv = mean > 0 ? 1.0 / mean : 0.0;
    std::vector<float> row_root(static_cast<size_t>(rows)), col_root(static_cast<size_t>(cols));
    for (int64_t i = 0; i < rows; ++i)
      row_root[static_cast<size_t>(i)] = static_cast<float>(std::sqrt(row[i] * inv));
    for (int64_t j = 0; j < cols; ++j)
      col_root[static_cast<size_t>(j)] = static_cast<float>(std::sqrt(static_cast<double>(col[j])));
    Q8Args q{m, nullptr, m_key, 0, args.rounding_key};
    q.row_root = row_root.data();
    q.col_root = col_root.data();
    q.cols = cols;
    run_q8<G>(master, ptr<G>(grad), param_copy, k, q);
  });
}

}  // namespace moetron::kernels::cpu
