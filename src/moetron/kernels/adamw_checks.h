// Argument checks shared by the AdamW backends (internal to kernels/): same
// rules, same messages, all run before anything is written.
#pragma once

#include "moetron/kernels/adamw.h"

namespace moetron::kernels::adamw_detail {

// step >= 1; master f32 or bf16 [n] (a bf16 master has no param_copy);
// grad, m and param_copy (if defined) of its shape; v of its shape and m's
// dtype. The dtypes the backend takes are checked where it dispatches on them.
inline void check_step_args(const Tensor& master, const Tensor& grad, const Tensor& m,
                            const Tensor& v, const AdamWArgs& args, const Tensor& param_copy) {
  MOETRON_CHECK(args.step >= 1, "adamw_step: step is 1-based, got ", args.step);
  MOETRON_CHECK(
      master.rank() == 1 && (master.dtype() == DType::f32 || master.dtype() == DType::bf16),
      "adamw_step: master must be f32 or bf16 [n], got ", master.str());
  MOETRON_CHECK(master.dtype() == DType::f32 || !param_copy.defined(),
                "adamw_step: a bf16 master is the working copy itself; got a param_copy ",
                param_copy.str());
  const Shape shape = master.shape();
  check_shape(grad, "adamw grad", shape);
  check_shape(m, "adamw m", shape);
  check_tensor(v, "adamw v", shape, m.dtype());
  if (param_copy.defined()) check_shape(param_copy, "adamw param_copy", shape);
}

}  // namespace moetron::kernels::adamw_detail
