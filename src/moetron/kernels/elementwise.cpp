#include "moetron/kernels/elementwise.h"

namespace moetron::kernels {

void add(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& out) {
  MOETRON_KERNEL_DISPATCH(ctx, add, a, b, out);
}
void scale(Context& ctx, const Tensor& x, float alpha, const Tensor& out) {
  MOETRON_KERNEL_DISPATCH(ctx, scale, x, alpha, out);
}
void axpy(Context& ctx, float alpha, const Tensor& x, const Tensor& y) {
  MOETRON_KERNEL_DISPATCH(ctx, axpy, alpha, x, y);
}
void convert(Context& ctx, const Tensor& src, const Tensor& dst) {
  MOETRON_KERNEL_DISPATCH(ctx, convert, src, dst);
}
double sum_squares(Context& ctx, const Tensor& x) {
  MOETRON_KERNEL_DISPATCH(ctx, sum_squares, x);
}
double sum_squared_difference(Context& ctx, const Tensor& a, const Tensor& b) {
  MOETRON_KERNEL_DISPATCH(ctx, sum_squared_difference, a, b);
}

}  // namespace moetron::kernels
