#include "moetron/kernels/elementwise.h"

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd.h"

namespace moetron::kernels::cpu {

namespace {
void check_same(const Tensor& a, const Tensor& b, const char* what) {
  MOETRON_CHECK(a.numel() == b.numel(), what, ": ", a.str(), " and ", b.str(),
                " differ in element count");
  MOETRON_CHECK(a.dtype() == b.dtype(), what, ": ", a.str(), " and ", b.str(), " differ in dtype");
}
}  // namespace

void add(Context&, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_same(a, out, "add");
  check_same(b, out, "add");
  dispatch_float(out.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = ptr<T>(a);
    const T* pb = ptr<T>(b);
    T* po = ptr<T>(out);
    const int64_t n = out.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) po[i] = from_f32<T>(to_f32(pa[i]) + to_f32(pb[i]));
  });
}

void scale(Context&, const Tensor& x, float alpha, const Tensor& out) {
  check_same(x, out, "scale");
  dispatch_float(out.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    const T* px = ptr<T>(x);
    T* po = ptr<T>(out);
    const int64_t n = out.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) po[i] = from_f32<T>(alpha * to_f32(px[i]));
  });
}

void axpy(Context&, float alpha, const Tensor& x, const Tensor& y) {
  MOETRON_CHECK(x.numel() == y.numel(), "axpy: ", x.str(), " and ", y.str(),
                " differ in element count");
  MOETRON_CHECK(y.dtype() == DType::f32 || y.dtype() == x.dtype(), "axpy: y must be f32 or ",
                dtype_name(x.dtype()), ", got ", y.str());
  const int64_t n = y.numel();
  dispatch_float(x.dtype(), "axpy", [&](auto xtag) {
    using TX = decltype(xtag);
    const TX* px = ptr<TX>(x);
    dispatch_float(y.dtype(), "axpy", [&](auto ytag) {
      using TY = decltype(ytag);
      TY* py = ptr<TY>(y);
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) py[i] = from_f32<TY>(to_f32(py[i]) + alpha * to_f32(px[i]));
    });
  });
}

void convert(Context&, const Tensor& src, const Tensor& dst) {
  MOETRON_CHECK(src.numel() == dst.numel(), "convert: ", src.str(), " and ", dst.str(),
                " differ in element count");
  const int64_t n = dst.numel();
  if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16) {
    // Rounds to nearest even; NaN stays NaN.
    const float* s = ptr<float>(src);
    auto* d = ptr<uint16_t>(dst);
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n / 16 * 16; i += 16) {
      simd::store(reinterpret_cast<bf16*>(d + i), simd::load(s + i));
    }
    for (int64_t i = n / 16 * 16; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  // f16 <-> f32 with the F16C conversions: IEEE round to nearest even,
  // subnormals and NaN handled in hardware (fp16 training stages every f16
  // tensor through these).
  if (src.dtype() == DType::f32 && dst.dtype() == DType::f16) {
    const float* s = ptr<float>(src);
    auto* d = ptr<uint16_t>(dst);
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n / 16 * 16; i += 16) {
      simd::store(reinterpret_cast<f16*>(d + i), simd::load(s + i));
    }
    for (int64_t i = n / 16 * 16; i < n; ++i) d[i] = f32_to_f16(s[i]);
    return;
  }
  if (src.dtype() == DType::f16 && dst.dtype() == DType::f32) {
    const auto* s = ptr<uint16_t>(src);
    float* d = ptr<float>(dst);
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n / 16 * 16; i += 16) {
      simd::store(d + i, simd::load(reinterpret_cast<const f16*>(s + i)));
    }
    for (int64_t i = n / 16 * 16; i < n; ++i) d[i] = f16_to_f32(s[i]);
    return;
  }
  dispatch_float(src.dtype(), "convert", [&](auto stag) {
    using TS = decltype(stag);
    const TS* s = ptr<TS>(src);
    dispatch_float(dst.dtype(), "convert", [&](auto dtag) {
      using TD = decltype(dtag);
      TD* d = ptr<TD>(dst);
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) d[i] = from_f32<TD>(to_f32(s[i]));
    });
  });
}

// The sum of term(i) over [0, n) in double, by blocks: the result must not
// depend on whether the compiler vectorised the loop (an fp32 running sum
// over a block drifts by ~1e-5 relative when it does not). Memory-bound.
template <typename Term>
double blocked_double_sum(int64_t n, Term term) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > 65536)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double partial = 0;
    const int64_t end = std::min(n, (blk + 1) * kBlock);
#pragma omp simd reduction(+ : partial)
    for (int64_t i = blk * kBlock; i < end; ++i) partial += term(i);
    total += partial;
  }
  return total;
}

double sum_squares(Context&, const Tensor& x) {
  return dispatch_float(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = ptr<T>(x);
    return blocked_double_sum(x.numel(), [p](int64_t i) {
      const double v = to_f32(p[i]);
      return v * v;
    });
  });
}

double sum_squared_difference(Context&, const Tensor& a, const Tensor& b) {
  check_same(a, b, "sum_squared_difference");
  return dispatch_float(a.dtype(), "sum_squared_difference", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = ptr<T>(a);
    const T* pb = ptr<T>(b);
    return blocked_double_sum(a.numel(), [pa, pb](int64_t i) {
      const double d = static_cast<double>(to_f32(pa[i])) - to_f32(pb[i]);
      return d * d;
    });
  });
}

}  // namespace moetron::kernels::cpu
