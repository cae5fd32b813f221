#include "moetron/kernels/adamw.h"

namespace moetron::kernels {

void adamw_step(Context& ctx, const Tensor& master, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWArgs& args, const Tensor& param_copy) {
  MOETRON_KERNEL_DISPATCH_CUDA(ctx, adamw_step, master, grad, m, v, args, param_copy);
}

}  // namespace moetron::kernels
