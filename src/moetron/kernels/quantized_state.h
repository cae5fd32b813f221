// 8-bit optimizer state (optim.moment_dtype = "int8"): block-wise quantised
// with one fp32 scale per 256 values (Dettmers et al. 2022, "8-bit
// Optimizers via Block-wise Quantization"), stored with stochastic rounding.
//
// Codes are small floats relative to their block's largest magnitude:
//  - signed (AdamW's m, Muon's momentum): a sign bit, 4 exponent bits and 3
//    mantissa bits: 15 binades below the block maximum, then 8 subnormal
//    steps; 12.5% between neighbouring codes. (With 3 exponent bits and 4
//    mantissa bits a block whose moments span 4 decades put a quarter of
//    them in the subnormal steps: 16% RMS drift from fp32-state AdamW over
//    50 steps against 2.9% here, tests/kernels/quantized_state_test.cpp);
//  - unsigned (AdamW's second moment, stored as sqrt(v) so the 15 binades of
//    4 exponent bits cover 30 binades of v): 4 exponent and 4 mantissa bits,
//    6.25% steps. A positive value never rounds to 0 (the update divides by it).
// The code of value y (in units of scale / max_code_value) rounds to one of
// its two neighbouring codes, up with probability equal to its distance
// from the lower one: a state that changes by less than a code step per
// step (v with beta2 = 0.95 changes by ~5% of itself) still moves in
// expectation, where round-to-nearest would freeze it. The random bits are
// rounding_bits(key, element index) (kernels/stochastic_round.h): every
// backend and thread count gives the same codes, so a resume is bit-exact.
#pragma once

#include <cstdint>

#include "moetron/core/tensor.h"
#include "moetron/kernels/adamw.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/dispatch.h"

namespace moetron::kernels {

constexpr int64_t kStateBlock = 256;  // values per fp32 scale

enum class StateCode : uint8_t {
  signed_e4m3,    // sign, 4 exponent bits, 3 mantissa bits
  unsigned_e4m4,  // 4 exponent bits, 4 mantissa bits
};

// A code's magnitude bits: exponent (bias 2^bits - 1, so the largest
// binade is [1, 2)) and mantissa; the largest magnitude is 2 - 2^-mantissa.
struct CodeFormat {
  int exponent_bits, mantissa_bits;
  bool is_signed;
  constexpr int bias() const { return (1 << exponent_bits) - 1; }
  constexpr int top() const { return is_signed ? 127 : 255; }
  constexpr float max_magnitude() const {
    return 2.0f - 1.0f / static_cast<float>(1 << mantissa_bits);
  }
};
constexpr CodeFormat code_format(StateCode code) {
  return code == StateCode::signed_e4m3 ? CodeFormat{4, 3, true} : CodeFormat{4, 4, false};
}

// Scales a tensor of n values needs: ceil(n / kStateBlock).
constexpr int64_t state_scale_count(int64_t n) {
  return (n + kStateBlock - 1) / kStateBlock;
}

// One 8-bit state tensor: codes u8 [n] and scales f32 [state_scale_count(n)]
// (the largest magnitude of each block).
struct QuantizedState {
  Tensor codes, scales;
  StateCode code = StateCode::signed_e4m3;
};

// Allocates a zero state of n values (all codes 0, all scales 0).
QuantizedState zero_quantized_state(int64_t n, StateCode code, MemTag tag);

// The value of each code relative to its block's scale, in [-1, 1] (signed)
// or [0, 1]: code_value(c) * scale is what a code stands for.
float code_value(StateCode code, uint8_t c);

// x (f32 [n]) -> q: each block's scale is its largest |x|, each code the
// stochastic rounding of x / scale with rounding_bits(key, i).
MOETRON_KERNEL_DECL(void quantize_state(Context& ctx, const Tensor& x, const QuantizedState& q,
                                        uint32_t key))
// q -> x (f32 [n]).
MOETRON_KERNEL_DECL(void dequantize_state(Context& ctx, const QuantizedState& q, const Tensor& x))

// AdamW (adamw.h's formula and arguments) with m in signed codes and
// sqrt(v) in unsigned codes: each block decoded into fp32, updated there,
// used for the update, then re-encoded with stochastic rounding (m with
// m_key, sqrt(v) with v_key). With the variance frozen, v's codes and
// scales are left as they are. master: f32 or bf16 (stochastically rounded
// with args.rounding_key); grad f32 or bf16; param_copy as in adamw_step.
MOETRON_KERNEL_DECL(void adamw_step_q8(Context& ctx, const Tensor& master, const Tensor& grad,
                                       const QuantizedState& m, const QuantizedState& v,
                                       const AdamWArgs& args, uint32_t m_key, uint32_t v_key,
                                       const Tensor& param_copy))

// AdamW's second moment of a [rows, cols] matrix factored as in Adafactor
// (Shazeer & Stern 2018): exponential averages of the row means and the
// column means of g^2, and v_ij = row_i col_j / mean(row): rows + cols fp32
// values instead of rows x cols (optim.second_moment = "factored").
struct FactoredMoment {
  Tensor row, col;  // f32 [rows], f32 [cols]
};

// AdamW with 8-bit m (as adamw_step_q8) and a factored second moment:
// row_i = b2 row_i + (1 - b2) mean_j (s g_ij)^2 and col_j likewise over i
// (both left as they are when the variance is frozen), then adamw.h's update
// with v_ij = row_i col_j / mean(row) (0 while every row is 0). master, grad
// and param_copy hold rows x cols values, row-major.
MOETRON_KERNEL_DECL(void adamw_step_q8_factored(Context& ctx, const Tensor& master,
                                                const Tensor& grad, const QuantizedState& m,
                                                const FactoredMoment& v, const AdamWArgs& args,
                                                uint32_t m_key, const Tensor& param_copy))

}  // namespace moetron::kernels
