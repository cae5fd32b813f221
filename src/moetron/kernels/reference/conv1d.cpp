// 1-D convolution in double, straight from the definition in conv1d.h.
#include "moetron/kernels/conv1d.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

void conv1d_forward(Context&, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Conv1dArgs& args, const Tensor& y) {
  const int64_t l_out = check_conv1d_shapes("conv1d_forward", x, w, bias, args, y);
  const int64_t B = x.dim(0), L = x.dim(1), C = x.dim(2), O = w.dim(0), K = w.dim(2);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < l_out; ++t) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = load(bias, o);
        for (int64_t k = 0; k < K; ++k) {
          const int64_t p = t * args.stride - args.padding + k;
          if (p < 0 || p >= L) continue;
          for (int64_t c = 0; c < C; ++c)
            acc += load(w, (o * C + c) * K + k) * load(x, (b * L + p) * C + c);
        }
        store(y, (b * l_out + t) * O + o, acc);
      }
    }
  }
}

void conv1d_backward(Context&, const Tensor& dy, const Tensor& x, const Tensor& w,
                     const Conv1dArgs& args, const Tensor& dx, const Tensor& dw,
                     const Tensor& dbias) {
  const int64_t l_out = check_conv1d_shapes("conv1d_backward", x, w, dbias, args, dy);
  check_shape(dw, "conv1d dw", w.shape());
  if (dx.defined()) check_shape(dx, "conv1d dx", x.shape());
  const int64_t B = x.dim(0), L = x.dim(1), C = x.dim(2), O = w.dim(0), K = w.dim(2);
  std::vector<double> gx(static_cast<size_t>(x.numel()), 0.0);
  std::vector<double> gw = load_all(dw), gb = load_all(dbias);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < l_out; ++t) {
      for (int64_t o = 0; o < O; ++o) {
        const double g = load(dy, (b * l_out + t) * O + o);
        gb[static_cast<size_t>(o)] += g;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t p = t * args.stride - args.padding + k;
          if (p < 0 || p >= L) continue;
          for (int64_t c = 0; c < C; ++c) {
            const auto wi = static_cast<size_t>((o * C + c) * K + k);
            const auto xi = static_cast<size_t>((b * L + p) * C + c);
            gw[wi] += g * load(x, static_cast<int64_t>(xi));
            gx[xi] += g * load(w, static_cast<int64_t>(wi));
          }
        }
      }
    }
  }
  store_all(dw, gw);
  store_all(dbias, gb);
  if (dx.defined()) store_all(dx, gx);
}

}  // namespace moetron::kernels::reference
