// Argument checks shared by the RMSNorm backends (internal to kernels/):
// same rules, same messages, all run before anything is written.
#pragma once

#include "moetron/kernels/norm.h"

namespace moetron::kernels::norm_detail {

struct Dims {
  int64_t rows, cols;
};

// x [T, D]; w f32 [D]; rstd f32 [T]. Returns {T, D}.
inline Dims check_common(const char* fn, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  MOETRON_CHECK(x.rank() == 2, fn, ": x must be [T, D], got ", x.str());
  const Dims d{x.dim(0), x.dim(1)};
  check_tensor(w, "rmsnorm w", {d.cols}, DType::f32);
  check_tensor(rstd, "rmsnorm rstd", {d.rows}, DType::f32);
  return d;
}

}  // namespace moetron::kernels::norm_detail
