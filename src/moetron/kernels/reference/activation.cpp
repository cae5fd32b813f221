// SwiGLU and row softmax in double.
// silu(g) = g * s with s = sigmoid(g); d silu / dg = s * (1 + g * (1 - s)).
// softmax backward: dx = y * (dy - sum(dy * y)).
#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/kernels/activation.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

namespace {
double sigmoid(double g) {
  return 1.0 / (1.0 + std::exp(-g));
}

int64_t check_swiglu(const char* fn, const Tensor& gate_up, const Tensor& out) {
  MOETRON_CHECK(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0, fn,
                ": gate_up must be [T, 2F], got ", gate_up.str());
  MOETRON_CHECK(is_floating(gate_up.dtype()), fn, ": gate_up must be a float tensor, got ",
                gate_up.str());
  const int64_t F = gate_up.dim(1) / 2;
  check_tensor(out, "swiglu out", {gate_up.dim(0), F}, gate_up.dtype());
  return F;
}

// `a` is the tensor that fixes shape and dtype, `b` must match it.
void check_softmax(const char* fn, const Tensor& a, const char* a_name, const Tensor& b,
                   const char* b_name) {
  MOETRON_CHECK(a.rank() == 2, fn, ": ", a_name, " must be [R, C], got ", a.str());
  MOETRON_CHECK(is_floating(a.dtype()), fn, ": ", a_name, " must be a float tensor, got ", a.str());
  check_tensor(b, b_name, a.shape(), a.dtype());
}
}  // namespace

void swiglu_forward(Context&, const Tensor& gate_up, const Tensor& out) {
  const int64_t F = check_swiglu("swiglu_forward", gate_up, out);
  for (int64_t t = 0; t < gate_up.dim(0); ++t) {
    for (int64_t j = 0; j < F; ++j) {
      const double g = load(gate_up, t * 2 * F + j), u = load(gate_up, t * 2 * F + F + j);
      store(out, t * F + j, g * sigmoid(g) * u);
    }
  }
}

void swiglu_backward(Context&, const Tensor& dout, const Tensor& gate_up, const Tensor& d_gate_up) {
  const int64_t F = check_swiglu("swiglu_backward", gate_up, dout);
  check_tensor(d_gate_up, "swiglu d_gate_up", gate_up.shape(), gate_up.dtype());
  for (int64_t t = 0; t < gate_up.dim(0); ++t) {
    for (int64_t j = 0; j < F; ++j) {
      const double g = load(gate_up, t * 2 * F + j), u = load(gate_up, t * 2 * F + F + j);
      const double d = load(dout, t * F + j), s = sigmoid(g);
      store(d_gate_up, t * 2 * F + j, d * u * s * (1.0 + g * (1.0 - s)));
      store(d_gate_up, t * 2 * F + F + j, d * g * s);
    }
  }
}

void softmax_forward(Context&, const Tensor& x, const Tensor& y) {
  check_softmax("softmax_forward", x, "softmax x", y, "softmax y");
  const int64_t R = x.dim(0), C = x.dim(1);
  for (int64_t r = 0; r < R; ++r) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, load(x, r * C + c));
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(load(x, r * C + c) - mx);
    for (int64_t c = 0; c < C; ++c) store(y, r * C + c, std::exp(load(x, r * C + c) - mx) / sum);
  }
}

void softmax_backward(Context&, const Tensor& dy, const Tensor& y, const Tensor& dx) {
  check_softmax("softmax_backward", y, "softmax y", dy, "softmax dy");
  check_tensor(dx, "softmax dx", y.shape(), y.dtype());
  const int64_t R = y.dim(0), C = y.dim(1);
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += load(dy, r * C + c) * load(y, r * C + c);
    // dy[i] is read before dx[i] is written, so dx may alias dy.
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = r * C + c;
      store(dx, i, load(y, i) * (load(dy, i) - dot));
    }
  }
}

}  // namespace moetron::kernels::reference
