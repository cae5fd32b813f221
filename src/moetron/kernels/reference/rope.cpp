// Rotary embedding in double, rotate-half layout: for i < hd/2 the pair
// (x_i, x_{i+hd/2}) at position p is rotated by a = p * theta^(-2i/hd):
//   y_i = x_i cos a - x_{i+hd/2} sin a,  y_{i+hd/2} = x_{i+hd/2} cos a + x_i sin a.
// The backward applies the rotation by -a (the transpose of a rotation).
#include <cmath>

#include "moetron/kernels/reference/ref_util.h"
#include "moetron/kernels/rope.h"

namespace moetron::kernels::reference {

namespace {
void rope_rotate(const char* fn, const Tensor& src, const Tensor& positions, float theta,
                 const Tensor& dst, const char* dst_name, double direction) {
  MOETRON_CHECK(src.rank() == 3 && src.dim(2) % 2 == 0, fn,
                ": x must be [T, H, hd] with hd even, got ", src.str());
  MOETRON_CHECK(is_floating(src.dtype()), fn, ": x must be a float tensor, got ", src.str());
  check_tensor(dst, dst_name, src.shape(), src.dtype());
  const int64_t T = src.dim(0), H = src.dim(1), hd = src.dim(2), half = hd / 2;
  check_shape(positions, "rope positions", {T});
  const std::vector<int64_t> pos = load_ids(positions);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(theta),
                                       -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double a = static_cast<double>(pos[static_cast<size_t>(t)]) * inv_freq;
      const double c = std::cos(a), s = direction * std::sin(a);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = (t * H + h) * hd;
        // Both halves are read before either is written, so dst may alias src.
        const double x1 = load(src, base + i), x2 = load(src, base + half + i);
        store(dst, base + i, x1 * c - x2 * s);
        store(dst, base + half + i, x2 * c + x1 * s);
      }
    }
  }
}
}  // namespace

void rope_forward(Context&, const Tensor& x, const Tensor& positions, float theta,
                  const Tensor& y) {
  rope_rotate("rope_forward", x, positions, theta, y, "rope y", 1.0);
}

void rope_backward(Context&, const Tensor& dy, const Tensor& positions, float theta,
                   const Tensor& dx) {
  rope_rotate("rope_backward", dy, positions, theta, dx, "rope dx", -1.0);
}

}  // namespace moetron::kernels::reference
