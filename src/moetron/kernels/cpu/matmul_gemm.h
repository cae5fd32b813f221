// The one place the CPU backend talks to oneDNN matmul: a GEMM description,
// the primitive cache policy, and the fp32 -> bf16 output staging that
// oneDNN 2.6 lacks. matmul, grouped_matmul and its weight gradient are thin
// loops over gemm().
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>

#include "moetron/core/dtype.h"
#include "moetron/kernels/cpu/cpu_state.h"
#include "moetron/kernels/matmul.h"

namespace moetron::kernels::cpu {

// One GEMM, or a batch of equally shaped ones, on contiguous row-major
// matrices: c[i] = alpha * op(a[i]) op(b[i or 0]) + beta * c[i], fp32
// accumulation. Transposes are expressed as strides, never copies.
struct GemmSpec {
  int64_t batch = 1;
  bool b_batched = false;  // b holds `batch` matrices; otherwise one b shared by all
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;   // a stored [k, m] instead of [m, k]
  bool trans_b = false;   // b stored [n, k] instead of [k, n]
  DType ab = DType::f32;  // dtype of a and b: f32 or bf16
  DType c = DType::f32;   // f32 or bf16
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: c is write-only (never read, may hold NaN)
};

// The dimension that changes from call to call, if any (grouped GEMMs: the
// rows of a group, which move every step). Such GEMMs share one primitive
// whose dimension is given at run time, so the cache stays bounded however
// the routing moves and the arithmetic is a function of the shape alone (a
// mix of exact-shape and run-time primitives chosen by what earlier steps saw
// would break bit-exact resume).
enum class VaryingDim : uint8_t { none, m, k };

void gemm(CpuState& st, const GemmSpec& s, const void* a, const void* b, void* c,
          VaryingDim varying = VaryingDim::none);

// The state's fp32 slots gemm() requests for s (kernels::cpu_gemm_slots),
// with `widens` whether bf16 operands are widened (no native bf16 matmul).
GemmSlots gemm_slots(const GemmSpec& s, bool widens);

// Whether oneDNN runs bf16 x bf16 matmuls on this CPU (else gemm widens the
// operands into the state's fp32 scratch slots).
bool has_native_bf16_matmul(CpuState& st);

// oneDNN memory descriptors of a GEMM (2-D, or 3-D when batch > 1) with the
// given dst dtype; exposed so benchmarks can build the same primitive by hand.
struct GemmDescs {
  dnnl::memory::desc a, b, c;
};
GemmDescs gemm_descs(const GemmSpec& s, dnnl::memory::data_type c_dtype,
                     VaryingDim runtime = VaryingDim::none);
dnnl::memory::data_type to_dnnl(DType t);

}  // namespace moetron::kernels::cpu
