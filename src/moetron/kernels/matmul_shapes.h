// Shape and dtype validation for the matmul family, shared by every backend
// so they accept and reject exactly the same calls. Each check throws
// moetron::Error naming the argument and the shapes involved.
#pragma once

#include <cstdint>
#include <span>

#include "moetron/core/tensor.h"
#include "moetron/kernels/matmul.h"

namespace moetron::kernels {

// Which dtypes a backend takes: the CPU and CUDA backends f32/bf16 inputs
// (equal) and f32/bf16 outputs; the reference any float dtype, including f64.
enum class DtypePolicy { cpu, cuda, reference };

struct MatmulDims {
  int64_t batch = 1;  // product of the leading dims of a (1 for 2-D a)
  int64_t m = 0, n = 0, k = 0;
  bool b_batched = false;  // b has the batch dims; otherwise one 2-D b shared by all
};
MatmulDims check_matmul(const Tensor& a, const Tensor& b, const Tensor& c, const MatmulArgs& args,
                        DtypePolicy policy);

struct GroupedDims {
  int64_t groups = 0;  // E
  int64_t rows = 0;    // T
  int64_t n = 0, k = 0;
};
GroupedDims check_grouped_matmul(const Tensor& x, const Tensor& w, std::span<const int64_t> offsets,
                                 const Tensor& y, bool trans_w, DtypePolicy policy);
GroupedDims check_grouped_weight_grad(const Tensor& dy, const Tensor& x,
                                      std::span<const int64_t> offsets, const Tensor& dw,
                                      DtypePolicy policy);

}  // namespace moetron::kernels
