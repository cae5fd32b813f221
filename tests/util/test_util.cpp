#include "util/test_util.h"

#include <cmath>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"

namespace moetron::test {

Tensor random_tensor(const Shape& shape, DType dtype, const std::string& name, float lo, float hi) {
  Tensor t = Tensor::empty(shape, dtype, MemTag::workspace);
  fill_uniform(t, 1234, name, lo, hi);
  return t;
}

Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, MemTag::workspace);
  t.poison();
  return t;
}

double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32:
      return t.data<float>()[i];
    case DType::f64:
      return t.data<double>()[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::i32:
      return t.data<int32_t>()[i];
    case DType::i64:
      return static_cast<double>(t.data<int64_t>()[i]);
    case DType::u8:
      return t.data<uint8_t>()[i];
  }
  return 0;
}

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = element(t, i);
  return v;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype, MemTag::workspace);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = element(t, i);
    switch (dtype) {
      case DType::f32:
        out.data<float>()[i] = static_cast<float>(x);
        break;
      case DType::f64:
        out.data<double>()[i] = x;
        break;
      case DType::bf16:
        static_cast<uint16_t*>(out.raw())[i] = f32_to_bf16(static_cast<float>(x));
        break;
      case DType::f16:
        static_cast<uint16_t*>(out.raw())[i] = f32_to_f16(static_cast<float>(x));
        break;
      case DType::i32:
        out.data<int32_t>()[i] = static_cast<int32_t>(x);
        break;
      case DType::i64:
        out.data<int64_t>()[i] = static_cast<int64_t>(x);
        break;
      case DType::u8:
        out.data<uint8_t>()[i] = static_cast<uint8_t>(x);
        break;
    }
  }
  return out;
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  if (actual.numel() != expected.numel()) {
    return ::testing::AssertionFailure()
           << "size mismatch: " << actual.str() << " vs " << expected.str();
  }
  int64_t worst = -1, bad = 0;
  double worst_excess = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = element(actual, i), e = element(expected, i);
    if (std::isnan(e) && std::isnan(a)) continue;
    if (std::isinf(e) && a == e) continue;
    const double allowed = tol.atol + tol.rtol * std::fabs(e);
    const double err = std::fabs(a - e);
    if (!(err <= allowed)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err / (allowed > 0 ? allowed : 1e-300);
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.numel() << " elements of " << actual.str()
         << " out of tolerance (rtol " << tol.rtol << ", atol " << tol.atol << "); worst at "
         << worst << ": actual " << element(actual, worst) << " expected "
         << element(expected, worst);
}

double max_normalized_error(const Tensor& actual, const Tensor& expected) {
  double max_err = 0, max_ref = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = element(actual, i), e = element(expected, i);
    const double err = std::fabs(a - e);
    if (std::isnan(err)) return INFINITY;
    max_err = std::max(max_err, err);
    max_ref = std::max(max_ref, std::fabs(e));
  }
  return max_err / std::max(max_ref, 1e-30);
}

::testing::AssertionResult normalized_close(const Tensor& actual, const Tensor& expected,
                                            double tol) {
  if (actual.numel() != expected.numel()) {
    return ::testing::AssertionFailure()
           << "size mismatch: " << actual.str() << " vs " << expected.str();
  }
  const double err = max_normalized_error(actual, expected);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "normalised error " << err << " exceeds " << tol << " for " << actual.str();
}

::testing::AssertionResult finite_difference_check(const std::function<double()>& loss,
                                                   const Tensor& x, const Tensor& analytic,
                                                   double h, double tol) {
  if (x.dtype() != DType::f64) {
    return ::testing::AssertionFailure() << "finite differences need an f64 input, got " << x.str();
  }
  double* p = x.data<double>();
  double max_abs = 0;
  std::vector<double> fd(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    fd[static_cast<size_t>(i)] = (up - down) / (2 * h);
    max_abs =
        std::max({max_abs, std::fabs(fd[static_cast<size_t>(i)]), std::fabs(element(analytic, i))});
  }
  const double floor = std::max(max_abs, 1e-3);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double a = element(analytic, i), f = fd[static_cast<size_t>(i)];
    if (!(std::fabs(a - f) <= tol * floor)) {
      return ::testing::AssertionFailure()
             << "gradient mismatch at element " << i << " of " << x.str() << ": analytic " << a
             << ", finite difference " << f << " (tolerance " << tol * floor << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moetron::test
