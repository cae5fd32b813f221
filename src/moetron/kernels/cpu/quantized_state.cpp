// 8-bit optimizer state on the CPU: blocks of kStateBlock values, OpenMP
// over blocks. Decoding is a 256-entry table times the block's scale;
// encoding reads the code off the bits of y = |x| / scale * 1.9375 (the
// largest code's magnitude): the exponent picks the binade, the top four
// mantissa bits the step within it, and 19 random bits added below them
// round up with probability equal to the dropped fraction.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/cpu/stochastic_store.h"
#include "moetron/kernels/quantized_state.h"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::cpu {

namespace {

using Table = std::array<float, 256>;

const Table& table_of(StateCode code) {
  static const auto build = [](StateCode c) {
    Table t{};
    for (int i = 0; i < 256; ++i)
      t[static_cast<size_t>(i)] = code_value(c, static_cast<uint8_t>(i));
    return t;
  };
  static const Table signed_table = build(StateCode::signed_e4m3);
  static const Table unsigned_table = build(StateCode::unsigned_e4m4);
  return code == StateCode::signed_e4m3 ? signed_table : unsigned_table;
}

// The magnitude code of y in [0, max_magnitude]: normal values by their
// bits (exponent, kept mantissa, random bits added below it), subnormal
// ones in integer steps of the smallest normal binade's spacing.
inline uint32_t magnitude_code(float y, uint32_t random, const CodeFormat& f) {
  const uint32_t dropped = 23 - static_cast<uint32_t>(f.mantissa_bits);
  const uint32_t mask = (1u << dropped) - 1;
  uint32_t u;
  std::memcpy(&u, &y, 4);
  if (static_cast<int>(u >> 23) - 127 + f.bias() >= 1) {
    const uint32_t r = u + (random & mask);
    const int e = static_cast<int>(r >> 23) - 127 + f.bias();
    const uint32_t c = (static_cast<uint32_t>(e) << f.mantissa_bits) |
                       ((r >> dropped) & ((1u << f.mantissa_bits) - 1));
    return std::min(c, static_cast<uint32_t>(f.top()));
  }
  const float t = std::ldexp(y, f.bias() + f.mantissa_bits - 1);
  const float frac =
      static_cast<float>(random & mask) * std::ldexp(1.0f, -static_cast<int>(dropped));
  return static_cast<uint32_t>(t + frac);  // exact: t < 2^mantissa, frac has `dropped` bits
}

// rel = x / (its block's largest |x|), in [-1, 1].
inline uint8_t encode(StateCode code, float rel, uint32_t random) {
  const CodeFormat f = code_format(code);
  const float y = std::fabs(rel) * f.max_magnitude();
  const uint32_t c = magnitude_code(y, random, f);
  if (f.is_signed) return static_cast<uint8_t>(c | (rel < 0 && c != 0 ? 128u : 0u));
  return static_cast<uint8_t>(c == 0 && y > 0 ? 1 : c);  // sqrt(v) > 0 never decodes to 0
}

// Encodes vals[0, len) of block b (element index b * kStateBlock + j). The
// division by the block's maximum (not a multiply by its inverse) keeps
// that value's rel at exactly 1: it encodes to the top code and decodes to
// the scale itself.
void encode_block(StateCode code, const float* vals, int64_t len, int64_t b, uint8_t* codes,
                  float* scales, uint32_t key) {
  float amax = 0;
  for (int64_t j = 0; j < len; ++j) amax = std::max(amax, std::fabs(vals[j]));
  scales[b] = amax;
  const int64_t base = b * kStateBlock;
  for (int64_t j = 0; j < len; ++j) {
    codes[base + j] =
        amax > 0 ? encode(code, vals[j] / amax, rounding_bits(key, static_cast<uint32_t>(base + j)))
                 : 0;
  }
}

void decode_block(const Table& t, const uint8_t* codes, float scale, int64_t len, float* out) {
  for (int64_t j = 0; j < len; ++j) out[j] = t[codes[j]] * scale;
}

}  // namespace

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

struct Factors {
  simd::vf b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_sqrt_bc2, eps, lr, lr_wd, scale;
  bool frozen;
};

Factors make_factors(const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  const bool frozen = a.variance_frozen();
  const double b2 = frozen ? 1.0 : static_cast<double>(a.beta2);
  const double bc2 =
      1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.variance_step()));
  const auto f = [](double x) { return simd::set1(static_cast<float>(x)); };
  return {f(a.beta1),
          f(1.0 - static_cast<double>(a.beta1)),
          f(b2),
          f(1.0 - b2),
          f(1.0 / bc1),
          f(1.0 / std::sqrt(bc2)),
          f(a.eps),
          f(a.lr),
          f(static_cast<double>(a.lr) * static_cast<double>(a.weight_decay)),
          f(a.grad_scale),
          frozen};
}

struct Q8Args {
  const QuantizedState& m;
  const QuantizedState& v;
  uint32_t m_key, v_key, w_key;
};

// One block: decode m and sqrt(v), update in fp32 (adamw.h's formula),
// write the weights, re-encode the state. s holds sqrt(v) and is squared
// for the update; a frozen v keeps its codes.
template <typename W, typename G, typename P>
void adamw_block(W* w, const G* grad, P* copy, int64_t b, int64_t len, const Factors& k,
                 const Q8Args& q) {
  alignas(64) float m[kStateBlock], s[kStateBlock];
  const int64_t base = b * kStateBlock;
  decode_block(table_of(q.m.code), ptr<uint8_t>(q.m.codes) + base, ptr<float>(q.m.scales)[b], len,
               m);
  decode_block(table_of(q.v.code), ptr<uint8_t>(q.v.codes) + base, ptr<float>(q.v.scales)[b], len,
               s);
  for (int64_t j = 0; j < len; j += 16) {
    const simd::mask16 mk = lane_mask(len - j);
    const int64_t i = base + j;
    const simd::vf g = simd::mul(k.scale, load16(grad + i, mk));
    const simd::vf mi = simd::fmadd(k.b1, load16(m + j, mk), simd::mul(k.one_minus_b1, g));
    const simd::vf s_old = load16(s + j, mk);
    const simd::vf vi =
        simd::fmadd(k.b2, simd::mul(s_old, s_old), simd::mul(k.one_minus_b2, simd::mul(g, g)));
    const simd::vf root = k.frozen ? s_old : simd::sqrt(vi);
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
  if (!k.frozen)
    encode_block(q.v.code, s, len, b, ptr<uint8_t>(q.v.codes), ptr<float>(q.v.scales), q.v_key);
}

template <typename W, typename G, typename P>
void adamw_q8_loop(W* w, const G* grad, P* copy, int64_t n, const Factors& k, const Q8Args& q) {
  const int64_t blocks = state_scale_count(n);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t b = 0; b < blocks; ++b)
    adamw_block<W, G, P>(w, grad, copy, b, std::min(kStateBlock, n - b * kStateBlock), k, q);
}

}  // namespace

void adamw_step_q8(Context&, const Tensor& master, const Tensor& grad, const QuantizedState& m,
                   const QuantizedState& v, const AdamWArgs& args, uint32_t m_key, uint32_t v_key,
                   const Tensor& param_copy) {
  const Factors k = make_factors(args);
  const Q8Args q{m, v, m_key, v_key, args.rounding_key};
  const int64_t n = master.numel();
  dispatch_f32_bf16(grad.dtype(), "adamw_step_q8 grad", [&](auto gtag) {
    using G = decltype(gtag);
    const G* g = ptr<G>(grad);
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
  });
}

}  // namespace moetron::kernels::cpu
