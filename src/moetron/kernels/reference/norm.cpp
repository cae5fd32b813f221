// RMSNorm in double: xhat = x * rstd, y = xhat * w.
// Backward: dxhat = dy * w, dx = rstd * (dxhat - xhat * mean(dxhat * xhat)),
// dw += sum_t dy * xhat.
#include <cmath>

#include "moetron/kernels/norm.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

namespace {
struct Dims {
  int64_t rows, cols;
};

Dims check_common(const char* fn, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  MOETRON_CHECK(x.rank() == 2, fn, ": x must be [T, D], got ", x.str());
  MOETRON_CHECK(is_floating(x.dtype()), fn, ": x must be a float tensor, got ", x.str());
  const Dims d{x.dim(0), x.dim(1)};
  check_shape(w, "rmsnorm w", {d.cols});
  check_shape(rstd, "rmsnorm rstd", {d.rows});
  MOETRON_CHECK(is_floating(w.dtype()), fn, ": w must be a float tensor, got ", w.str());
  MOETRON_CHECK(is_floating(rstd.dtype()), fn, ": rstd must be a float tensor, got ", rstd.str());
  return d;
}
}  // namespace

void rmsnorm_forward(Context&, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  const Dims d = check_common("rmsnorm_forward", x, w, rstd);
  check_tensor(y, "rmsnorm y", x.shape(), x.dtype());
  for (int64_t t = 0; t < d.rows; ++t) {
    double ss = 0;
    for (int64_t j = 0; j < d.cols; ++j) {
      const double v = load(x, t * d.cols + j);
      ss += v * v;
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d.cols) + static_cast<double>(eps));
    store(rstd, t, r);
    for (int64_t j = 0; j < d.cols; ++j) {
      store(y, t * d.cols + j, load(x, t * d.cols + j) * r * load(w, j));
    }
  }
}

void rmsnorm_backward(Context&, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  const Dims d = check_common("rmsnorm_backward", x, w, rstd);
  check_tensor(dy, "rmsnorm dy", x.shape(), x.dtype());
  check_tensor(dx, "rmsnorm dx", x.shape(), x.dtype());
  check_shape(dw, "rmsnorm dw", {d.cols});
  MOETRON_CHECK(is_floating(dw.dtype()), "rmsnorm_backward: dw must be a float tensor, got ",
                dw.str());
  std::vector<double> dw_acc = load_all(dw);
  for (int64_t t = 0; t < d.rows; ++t) {
    const double r = load(rstd, t);
    double dot = 0;  // sum_j dxhat_j * xhat_j
    for (int64_t j = 0; j < d.cols; ++j) {
      const int64_t i = t * d.cols + j;
      dot += load(dy, i) * load(w, j) * load(x, i) * r;
    }
    const double mean_dot = dot / static_cast<double>(d.cols);
    for (int64_t j = 0; j < d.cols; ++j) {
      const int64_t i = t * d.cols + j;
      const double xhat = load(x, i) * r;
      const double g = load(dy, i);
      store(dx, i, r * (g * load(w, j) - xhat * mean_dot));
      dw_acc[static_cast<size_t>(j)] += g * xhat;
    }
  }
  store_all(dw, dw_acc);
}

}  // namespace moetron::kernels::reference
