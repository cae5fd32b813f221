// conv1d and GELU: the CPU kernels against the fp64 reference on awkward
// sizes (forward and every backward output), the reference against finite
// differences, bad shapes.
#include "moetron/kernels/conv1d.h"

#include <gtest/gtest.h>

#include <vector>

#include "moetron/kernels/gelu.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

struct Case {
  int64_t B, L, C, O, K, stride, padding;
};

std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (int64_t L : {1, 7, 33, 130}) {
    for (int64_t K : {1, 3, 5}) {
      for (int64_t stride : {1, 2, 3}) {
        const int64_t padding = K / 2;
        if (L + 2 * padding < K) continue;
        cases.push_back({2, L, 7, 33, K, stride, padding});
      }
    }
  }
  cases.push_back({1, 9, 1, 1, 3, 2, 0});
  cases.push_back({3, 17, 33, 7, 3, 2, 1});
  cases.push_back({1, 4, 80, 16, 3, 1, 1});  // log-mel width
  return cases;
}

// x, w, bias, dy of a case in `dt`; dw and db start non-zero (they accumulate).
struct Inputs {
  Tensor x, w, b, dy, dw, db;
};
Inputs make_inputs(const Case& c, DType dt, DType grad_dt) {
  Conv1dArgs a{c.stride, c.padding};
  const int64_t l_out = conv1d_output_length(c.L, c.K, a);
  return {random_tensor({c.B, c.L, c.C}, dt, "x"),
          random_tensor({c.O, c.C, c.K}, dt, "w"),
          random_tensor({c.O}, dt, "b"),
          random_tensor({c.B, l_out, c.O}, dt, "dy"),
          random_tensor({c.O, c.C, c.K}, grad_dt, "dw0"),
          random_tensor({c.O}, grad_dt, "db0")};
}

TEST(Conv1d, CpuMatchesReferenceForwardAndBackward) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
    for (const Case& c : sweep()) {
      SCOPED_TRACE(testing::Message()
                   << dtype_name(dt) << " B=" << c.B << " L=" << c.L << " C=" << c.C << " O=" << c.O
                   << " K=" << c.K << " stride=" << c.stride << " pad=" << c.padding);
      const Conv1dArgs a{c.stride, c.padding};
      const Inputs in = make_inputs(c, dt, DType::f32);
      const Shape y_shape = in.dy.shape();
      Tensor y = poisoned(y_shape, dt), y_ref = poisoned(y_shape, dt);
      conv1d_forward(cpu, in.x, in.w, in.b, a, y);
      conv1d_forward(ref, in.x, in.w, in.b, a, y_ref);
      EXPECT_TRUE(test::normalized_close(y, y_ref, tol));

      Tensor dx = poisoned(in.x.shape(), dt), dx_ref = poisoned(in.x.shape(), dt);
      Tensor dw = in.dw.clone(), dw_ref = in.dw.clone();
      Tensor db = in.db.clone(), db_ref = in.db.clone();
      conv1d_backward(cpu, in.dy, in.x, in.w, a, dx, dw, db);
      conv1d_backward(ref, in.dy, in.x, in.w, a, dx_ref, dw_ref, db_ref);
      EXPECT_TRUE(test::normalized_close(dx, dx_ref, tol));
      EXPECT_TRUE(test::normalized_close(dw, dw_ref, tol));
      EXPECT_TRUE(test::normalized_close(db, db_ref, tol));

      // Without dx: the same weight gradients.
      Tensor dw2 = in.dw.clone(), db2 = in.db.clone();
      conv1d_backward(cpu, in.dy, in.x, in.w, a, Tensor(), dw2, db2);
      EXPECT_TRUE(test::all_close(dw2, dw, {0, 0}));
      EXPECT_TRUE(test::all_close(db2, db, {0, 0}));
    }
  }
}

TEST(Conv1d, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  for (const Case& c : {Case{2, 7, 3, 4, 3, 2, 1}, Case{1, 6, 2, 3, 3, 1, 0}}) {
    const Conv1dArgs a{c.stride, c.padding};
    Inputs in = make_inputs(c, DType::f64, DType::f64);
    Tensor y = Tensor::empty(in.dy.shape(), DType::f64);
    const auto loss = [&] {  // sum(y * dy): its gradient wrt y is dy
      conv1d_forward(ref, in.x, in.w, in.b, a, y);
      double s = 0;
      for (int64_t i = 0; i < y.numel(); ++i) s += y.data<double>()[i] * in.dy.data<double>()[i];
      return s;
    };
    Tensor dx = Tensor::empty(in.x.shape(), DType::f64);
    Tensor dw = Tensor::zeros(in.w.shape(), DType::f64), db = Tensor::zeros({c.O}, DType::f64);
    conv1d_backward(ref, in.dy, in.x, in.w, a, dx, dw, db);
    EXPECT_TRUE(test::finite_difference_check(loss, in.x, dx));
    EXPECT_TRUE(test::finite_difference_check(loss, in.w, dw));
    EXPECT_TRUE(test::finite_difference_check(loss, in.b, db));
  }
}

TEST(Conv1d, RejectsBadShapes) {
  Context cpu(Backend::cpu);
  const Tensor x = random_tensor({1, 2, 3}, DType::f32, "x");
  const Tensor w = random_tensor({4, 3, 5}, DType::f32, "w"),
               b = random_tensor({4}, DType::f32, "b");
  EXPECT_NE(test::error_of([&] {
              conv1d_forward(cpu, x, w, b, {1, 0}, Tensor::empty({1, 1, 4}, DType::f32));
            }).find("shorter than the kernel"),
            std::string::npos);
  const Tensor w_bad = random_tensor({4, 2, 3}, DType::f32, "w");
  EXPECT_NE(test::error_of([&] {
              conv1d_forward(cpu, x, w_bad, b, {1, 1}, Tensor::empty({1, 2, 4}, DType::f32));
            }).find("w must be"),
            std::string::npos);
}

TEST(Gelu, CpuMatchesReferenceAndFiniteDifferences) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t n : test::kAwkwardSizes) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      const Tensor x = random_tensor({n, 5}, dt, "x", -4.0f, 4.0f);
      const Tensor dy = random_tensor({n, 5}, dt, "dy");
      Tensor y = poisoned({n, 5}, dt), y_ref = poisoned({n, 5}, dt);
      gelu_forward(cpu, x, y);
      gelu_forward(ref, x, y_ref);
      const test::Tolerance tol{dt == DType::f32 ? 1e-5 : 8e-3, 1e-6};
      EXPECT_TRUE(test::all_close(y, y_ref, tol));
      Tensor dx = poisoned({n, 5}, dt), dx_ref = poisoned({n, 5}, dt);
      gelu_backward(cpu, dy, x, dx);
      gelu_backward(ref, dy, x, dx_ref);
      EXPECT_TRUE(test::all_close(dx, dx_ref, tol));
    }
  }
  const Tensor x = random_tensor({9}, DType::f64, "x", -4.0f, 4.0f);
  const Tensor r = random_tensor({9}, DType::f64, "r");
  Tensor y = Tensor::empty({9}, DType::f64), dx = Tensor::empty({9}, DType::f64);
  const auto loss = [&] {
    gelu_forward(ref, x, y);
    double s = 0;
    for (int64_t i = 0; i < 9; ++i) s += y.data<double>()[i] * r.data<double>()[i];
    return s;
  };
  gelu_backward(ref, r, x, dx);
  EXPECT_TRUE(test::finite_difference_check(loss, x, dx));
}

}  // namespace
}  // namespace moetron::kernels
