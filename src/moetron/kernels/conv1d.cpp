#include "moetron/kernels/conv1d.h"

namespace moetron::kernels {

int64_t conv1d_output_length(int64_t length, int64_t kernel, const Conv1dArgs& args) {
  MOETRON_CHECK(args.stride >= 1 && args.padding >= 0 && kernel >= 1,
                "conv1d: stride must be >= 1, padding >= 0 and kernel >= 1, got stride ",
                args.stride, ", padding ", args.padding, ", kernel ", kernel);
  MOETRON_CHECK(length + 2 * args.padding >= kernel, "conv1d: ", length, " positions padded by ",
                args.padding, " are shorter than the kernel's ", kernel);
  return (length + 2 * args.padding - kernel) / args.stride + 1;
}

int64_t check_conv1d_shapes(const char* fn, const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Conv1dArgs& args, const Tensor& y) {
  MOETRON_CHECK(x.rank() == 3, fn, ": x must be [B, L, C_in], got ", x.str());
  MOETRON_CHECK(w.rank() == 3 && w.dim(1) == x.dim(2), fn, ": w must be [C_out, ", x.dim(2),
                ", K], got ", w.str());
  const int64_t l_out = conv1d_output_length(x.dim(1), w.dim(2), args);
  check_shape(bias, "conv1d bias", {w.dim(0)});
  check_shape(y, "conv1d output", {x.dim(0), l_out, w.dim(0)});
  return l_out;
}

void conv1d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Conv1dArgs& args, const Tensor& y) {
  MOETRON_KERNEL_DISPATCH(ctx, conv1d_forward, x, w, bias, args, y);
}
void conv1d_backward(Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                     const Conv1dArgs& args, const Tensor& dx, const Tensor& dw,
                     const Tensor& dbias) {
  MOETRON_KERNEL_DISPATCH(ctx, conv1d_backward, dy, x, w, args, dx, dw, dbias);
}

}  // namespace moetron::kernels
