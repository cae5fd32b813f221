// Shared helpers for kernel tests: random inputs, tolerance comparisons with a
// report of the worst element, and a finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::test {

// Uniform in [lo, hi) from the Philox stream `name` (seed fixed): reproducible.
Tensor random_tensor(const Shape& shape, DType dtype, const std::string& name, float lo = -1.0f,
                     float hi = 1.0f);
// An output tensor pre-filled with NaN (or -1 for integers): an element that is
// never written fails every comparison.
Tensor poisoned(const Shape& shape, DType dtype);
// Element i converted to double (any dtype).
double element(const Tensor& t, int64_t i);
std::vector<double> to_doubles(const Tensor& t);
Tensor to_dtype(const Tensor& t, DType dtype);

struct Tolerance {
  double rtol;  // relative to |expected|
  double atol;  // absolute floor, usually a fraction of max|expected|
};

// Passes when every |actual - expected| <= atol + rtol * |expected| and no
// element is NaN unless expected is NaN. The failure names the worst element.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, Tolerance tol);
// Normalised error max|a - e| / max(max|e|, tiny); a relative metric for
// outputs whose entries can be near zero.
double max_normalized_error(const Tensor& actual, const Tensor& expected);
::testing::AssertionResult normalized_close(const Tensor& actual, const Tensor& expected,
                                            double tol);

// Central finite differences of a scalar function of the double tensor `x`
// (modified in place and restored), compared with `analytic` (same shape).
// Step h, tolerance relative to max(|fd|, |analytic|, floor).
::testing::AssertionResult finite_difference_check(const std::function<double()>& loss,
                                                   const Tensor& x, const Tensor& analytic,
                                                   double h = 1e-6, double tol = 1e-6);

// The awkward sizes every kernel test sweeps: 1, 7, 33, 130 and so on.
inline const std::vector<int64_t> kAwkwardSizes = {1, 7, 33, 130};

// a followed by b (config --set lists: a base plus one case's keys).
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b);

// The message of the moetron::Error that fn throws ("" when it throws none).
std::string error_of(const std::function<void()>& fn);

}  // namespace moetron::test
