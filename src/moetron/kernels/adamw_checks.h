// Argument checks shared by the AdamW backends (internal to kernels/): same
// rules, same messages, all run before anything is written.
#pragma once

#include "moetron/kernels/adamw.h"

namespace moetron::kernels::adamw_detail {

// step >= 1; master f32 [n]; grad, m and param_copy (if defined) of its
// shape; v of its shape and m's dtype. The dtypes the backend takes are
// checked where it dispatches on them.
inline void check_step_args(const Tensor& master, const Tensor& grad, const Tensor& m,
                            const Tensor& v, const AdamWArgs& args, const Tensor& param_copy) {
  MOETRON_CHECK(args.step >= 1, "adamw_step: step is 1-based, got ", args.step);
  MOETRON_CHECK(master.rank() == 1 && master.dtype() == DType::f32,
                "adamw_step: master must be f32 [n], got ", master.str());
  const Shape shape = master.shape();
  check_shape(grad, "adamw grad", shape);
  check_shape(m, "adamw m", shape);
  check_tensor(v, "adamw v", shape, m.dtype());
  if (param_copy.defined()) check_shape(param_copy, "adamw param_copy", shape);
}

}  // namespace moetron::kernels::adamw_detail
