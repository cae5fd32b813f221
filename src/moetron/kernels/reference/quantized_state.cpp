// 8-bit optimizer state, obviously correct: every code's value from
// code_value, the two codes around a value found by searching all of them,
// and the stochastic choice between them made from the same random bits as
// every backend (up when bits / 2^k >= 1 - p, k = 23 - mantissa bits, p the value's distance
// from the lower code as a fraction of the gap). AdamW's math in double,
// its state and weights rounded to fp32 as the fp32 backends hold them.
#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/kernels/quantized_state.h"
#include "moetron/kernels/reference/ref_util.h"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::reference {

namespace {

// The code for rel = x / (block's largest |x|) in [-1, 1].
uint8_t encode(StateCode code, float rel, uint32_t random) {
  const double y = std::fabs(static_cast<double>(rel));
  const CodeFormat f = code_format(code);
  const int count = f.top() + 1;
  int down = 0;  // the largest code whose value is <= y (values grow with the code)
  for (int c = 0; c < count; ++c) {
    if (static_cast<double>(code_value(code, static_cast<uint8_t>(c))) <= y) down = c;
  }
  int c = down;
  if (down + 1 < count) {
    const double lo = code_value(code, static_cast<uint8_t>(down));
    const double hi = code_value(code, static_cast<uint8_t>(down + 1));
    const double p = (y - lo) / (hi - lo);
    const int dropped = 23 - f.mantissa_bits;  // the random bits every backend uses
    const double r = std::ldexp(static_cast<double>(random & ((1u << dropped) - 1)), -dropped);
    if (r >= 1.0 - p) c = down + 1;
  }
  if (!f.is_signed) return static_cast<uint8_t>(c == 0 && y > 0 ? 1 : c);
  return static_cast<uint8_t>(c | (rel < 0 && c != 0 ? 128 : 0));
}

void encode_all(const std::vector<float>& vals, const QuantizedState& q, uint32_t key) {
  const int64_t n = static_cast<int64_t>(vals.size());
  for (int64_t b = 0; b < state_scale_count(n); ++b) {
    const int64_t lo = b * kStateBlock, hi = std::min(n, lo + kStateBlock);
    float amax = 0;
    for (int64_t i = lo; i < hi; ++i)
      amax = std::max(amax, std::fabs(vals[static_cast<size_t>(i)]));
    q.scales.data<float>()[b] = amax;
    for (int64_t i = lo; i < hi; ++i) {
      q.codes.data<uint8_t>()[i] = amax > 0 ? encode(q.code, vals[static_cast<size_t>(i)] / amax,
                                                     rounding_bits(key, static_cast<uint32_t>(i)))
                                            : 0;
    }
  }
}

float decode(const QuantizedState& q, int64_t i) {
  return code_value(q.code, q.codes.data<uint8_t>()[i]) * q.scales.data<float>()[i / kStateBlock];
}

}  // namespace

void quantize_state(Context&, const Tensor& x, const QuantizedState& q, uint32_t key) {
  std::vector<float> vals(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) vals[static_cast<size_t>(i)] = x.data<float>()[i];
  encode_all(vals, q, key);
}

void dequantize_state(Context&, const QuantizedState& q, const Tensor& x) {
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = decode(q, i);
}

void adamw_step_q8(Context&, const Tensor& master, const Tensor& grad, const QuantizedState& m,
                   const QuantizedState& v, const AdamWArgs& args, uint32_t m_key, uint32_t v_key,
                   const Tensor& param_copy) {
  const int64_t n = master.numel();
  const double b1 = args.beta1, b2 = args.beta2, lr = args.lr, wd = args.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(args.step));
  const bool frozen = args.variance_frozen();
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(args.variance_step()));
  const Tensor w = master.reshape({n}), g = grad.reshape({n});
  std::vector<float> m_new(static_cast<size_t>(n)), s_new(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double gi = static_cast<double>(args.grad_scale) * load(g, i);
    const double mi = b1 * decode(m, i) + (1.0 - b1) * gi;
    const double s_old = decode(v, i);
    const double root = frozen ? s_old : std::sqrt(b2 * s_old * s_old + (1.0 - b2) * gi * gi);
    const double wi = load(w, i);
    const double w_new = wi - lr * (wd * wi + (mi / bc1) / (root / std::sqrt(bc2) + args.eps));
    m_new[static_cast<size_t>(i)] = static_cast<float>(mi);
    s_new[static_cast<size_t>(i)] = static_cast<float>(root);
    store_master(w, i, w_new, args.rounding_key);
    if (param_copy.defined()) store(param_copy.reshape({n}), i, w_new);
  }
  encode_all(m_new, m, m_key);
  if (!frozen) encode_all(s_new, v, v_key);
}

void adamw_step_q8_factored(Context&, const Tensor& master, const Tensor& grad,
                            const QuantizedState& m, const FactoredMoment& v, const AdamWArgs& args,
                            uint32_t m_key, const Tensor& param_copy) {
  const int64_t rows = v.row.numel(), cols = v.col.numel(), n = rows * cols;
  const Tensor g = grad.reshape({n});
  const auto gs = [&](int64_t i) { return static_cast<double>(args.grad_scale) * load(g, i); };
  if (!args.variance_frozen()) {
    const double b2 = args.beta2;
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += gs(r * cols + c) * gs(r * cols + c);
      v.row.data<float>()[r] = static_cast<float>(b2 * v.row.data<float>()[r] +
                                                  (1.0 - b2) * sum / static_cast<double>(cols));
    }
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += gs(r * cols + c) * gs(r * cols + c);
      v.col.data<float>()[c] = static_cast<float>(b2 * v.col.data<float>()[c] +
                                                  (1.0 - b2) * sum / static_cast<double>(rows));
    }
  }
  double mean = 0;
  for (int64_t r = 0; r < rows; ++r) mean += v.row.data<float>()[r];
  mean /= static_cast<double>(rows);
  const double b1 = args.beta1, lr = args.lr, wd = args.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(args.step));
  const double bc2 =
      1.0 - std::pow(static_cast<double>(args.beta2), static_cast<double>(args.variance_step()));
  const Tensor w = master.reshape({n});
  std::vector<float> m_new(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double mi = b1 * decode(m, i) + (1.0 - b1) * gs(i);
    const double vi = mean > 0 ? static_cast<double>(v.row.data<float>()[i / cols]) *
                                     v.col.data<float>()[i % cols] / mean
                               : 0.0;
    const double wi = load(w, i);
    const double w_new =
        wi - lr * (wd * wi + (mi / bc1) / (std::sqrt(vi / bc2) + static_cast<double>(args.eps)));
    m_new[static_cast<size_t>(i)] = static_cast<float>(mi);
    store_master(w, i, w_new, args.rounding_key);
    if (param_copy.defined()) store(param_copy.reshape({n}), i, w_new);
  }
  encode_all(m_new, m, m_key);
}

}  // namespace moetron::kernels::reference
