#include "moetron/kernels/matmul.h"

namespace moetron::kernels {

void matmul(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c, const MatmulArgs& args) {
  MOETRON_KERNEL_DISPATCH(ctx, matmul, a, b, c, args);
}
void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, std::span<const int64_t> offsets,
                    const Tensor& y, bool trans_w, float beta) {
  MOETRON_KERNEL_DISPATCH(ctx, grouped_matmul, x, w, offsets, y, trans_w, beta);
}
void grouped_matmul_weight_grad(Context& ctx, const Tensor& dy, const Tensor& x,
                                std::span<const int64_t> offsets, const Tensor& dw, float beta) {
  MOETRON_KERNEL_DISPATCH(ctx, grouped_matmul_weight_grad, dy, x, offsets, dw, beta);
}

}  // namespace moetron::kernels
