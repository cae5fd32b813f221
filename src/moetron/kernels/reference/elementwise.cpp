#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

namespace {
void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  MOETRON_CHECK(a.numel() == b.numel(), what, ": ", a.str(), " and ", b.str(),
                " differ in element count");
}
}  // namespace

void add(Context&, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_same_numel(a, out, "add");
  check_same_numel(b, out, "add");
  for (int64_t i = 0; i < out.numel(); ++i) store(out, i, load(a, i) + load(b, i));
}

void scale(Context&, const Tensor& x, float alpha, const Tensor& out) {
  check_same_numel(x, out, "scale");
  for (int64_t i = 0; i < out.numel(); ++i) store(out, i, static_cast<double>(alpha) * load(x, i));
}

void axpy(Context&, float alpha, const Tensor& x, const Tensor& y) {
  check_same_numel(x, y, "axpy");
  for (int64_t i = 0; i < y.numel(); ++i)
    store(y, i, load(y, i) + static_cast<double>(alpha) * load(x, i));
}

void convert(Context&, const Tensor& src, const Tensor& dst) {
  check_same_numel(src, dst, "convert");
  MOETRON_CHECK(is_floating(dst.dtype()), "convert into non-float ", dst.str());
  for (int64_t i = 0; i < dst.numel(); ++i) store(dst, i, load(src, i));
}

double sum_squares(Context&, const Tensor& x) {
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = load(x, i);
    s += v * v;
  }
  return s;
}

double sum_squared_difference(Context&, const Tensor& a, const Tensor& b) {
  check_same_numel(a, b, "sum_squared_difference");
  MOETRON_CHECK(a.dtype() == b.dtype(), "sum_squared_difference: ", a.str(), " and ", b.str(),
                " differ in dtype");
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = load(a, i) - load(b, i);
    s += d * d;
  }
  return s;
}

}  // namespace moetron::kernels::reference
