#include "moetron/kernels/quantized_state.h"

#include <cmath>

namespace moetron::kernels {

namespace {

void check_state(const QuantizedState& q, int64_t n, const char* fn) {
  MOETRON_CHECK(q.codes.defined() && q.codes.dtype() == DType::u8 && q.codes.numel() == n, fn,
                ": codes must be u8 with ", n, " values, got ",
                q.codes.defined() ? q.codes.str() : std::string("none"));
  MOETRON_CHECK(q.scales.defined() && q.scales.dtype() == DType::f32 &&
                    q.scales.numel() == state_scale_count(n),
                fn, ": scales must be f32 with ", state_scale_count(n), " values, got ",
                q.scales.defined() ? q.scales.str() : std::string("none"));
}

}  // namespace

QuantizedState zero_quantized_state(int64_t n, StateCode code, MemTag tag) {
  return {Tensor::zeros({n}, DType::u8, tag),
          Tensor::zeros({state_scale_count(n)}, DType::f32, tag), code};
}

float code_value(StateCode code, uint8_t c) {
  const CodeFormat f = code_format(code);
  const int mag = f.is_signed ? (c & 127) : c;
  const int e = mag >> f.mantissa_bits, m = mag & ((1 << f.mantissa_bits) - 1);
  const float value = e == 0 ? std::ldexp(static_cast<float>(m), 1 - f.bias() - f.mantissa_bits)
                             : std::ldexp(static_cast<float>((1 << f.mantissa_bits) + m),
                                          e - f.bias() - f.mantissa_bits);
  return (f.is_signed && (c & 128) ? -value : value) / f.max_magnitude();
}

void quantize_state(Context& ctx, const Tensor& x, const QuantizedState& q, uint32_t key) {
  MOETRON_CHECK(x.defined() && x.dtype() == DType::f32, "quantize_state: x must be f32, got ",
                x.defined() ? x.str() : std::string("none"));
  check_state(q, x.numel(), "quantize_state");
  MOETRON_KERNEL_DISPATCH(ctx, quantize_state, x, q, key);
}

void dequantize_state(Context& ctx, const QuantizedState& q, const Tensor& x) {
  MOETRON_CHECK(x.defined() && x.dtype() == DType::f32, "dequantize_state: x must be f32, got ",
                x.defined() ? x.str() : std::string("none"));
  check_state(q, x.numel(), "dequantize_state");
  MOETRON_KERNEL_DISPATCH(ctx, dequantize_state, q, x);
}

void adamw_step_q8(Context& ctx, const Tensor& master, const Tensor& grad, const QuantizedState& m,
                   const QuantizedState& v, const AdamWArgs& args, uint32_t m_key, uint32_t v_key,
                   const Tensor& param_copy) {
  MOETRON_CHECK(args.step >= 1, "adamw_step_q8: step is 1-based, got ", args.step);
  MOETRON_CHECK(master.defined() && (master.dtype() == DType::f32 || master.dtype() == DType::bf16),
                "adamw_step_q8: master must be f32 or bf16, got ", master.str());
  const int64_t n = master.numel();
  MOETRON_CHECK(grad.defined() && grad.numel() == n, "adamw_step_q8: grad ", grad.str(),
                " must have the master's ", n, " values");
  MOETRON_CHECK(m.code == StateCode::signed_e4m3 && v.code == StateCode::unsigned_e4m4,
                "adamw_step_q8: m takes signed codes and sqrt(v) unsigned ones");
  check_state(m, n, "adamw_step_q8 m");
  check_state(v, n, "adamw_step_q8 v");
  MOETRON_CHECK(!param_copy.defined() || (master.dtype() == DType::f32 && param_copy.numel() == n),
                "adamw_step_q8: param_copy must be undefined (a bf16 master is the working copy) "
                "or have the master's ",
                n, " values");
  MOETRON_KERNEL_DISPATCH(ctx, adamw_step_q8, master, grad, m, v, args, m_key, v_key, param_copy);
}

void adamw_step_q8_factored(Context& ctx, const Tensor& master, const Tensor& grad,
                            const QuantizedState& m, const FactoredMoment& v, const AdamWArgs& args,
                            uint32_t m_key, const Tensor& param_copy) {
  MOETRON_CHECK(v.row.defined() && v.col.defined() && v.row.dtype() == DType::f32 &&
                    v.col.dtype() == DType::f32,
                "adamw_step_q8_factored: the factored moment's row and col must be f32");
  const int64_t n = v.row.numel() * v.col.numel();
  MOETRON_CHECK(master.defined() && master.numel() == n &&
                    (master.dtype() == DType::f32 || master.dtype() == DType::bf16),
                "adamw_step_q8_factored: master must be f32 or bf16 with rows x cols = ", n,
                " values, got ", master.str());
  MOETRON_CHECK(grad.defined() && grad.numel() == n, "adamw_step_q8_factored: grad ", grad.str(),
                " must have ", n, " values");
  MOETRON_CHECK(m.code == StateCode::signed_e4m3, "adamw_step_q8_factored: m takes signed codes");
  check_state(m, n, "adamw_step_q8_factored m");
  MOETRON_CHECK(!param_copy.defined() || (master.dtype() == DType::f32 && param_copy.numel() == n),
                "adamw_step_q8_factored: param_copy must be undefined (a bf16 master is the "
                "working copy) or have ",
                n, " values");
  MOETRON_KERNEL_DISPATCH(ctx, adamw_step_q8_factored, master, grad, m, v, args, m_key, param_copy);
}

}  // namespace moetron::kernels
