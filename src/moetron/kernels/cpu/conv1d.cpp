// 1-D convolution on the CPU, lowered to the GEMMs of kernels/matmul.h:
// im2col gathers each output position's receptive field into a row
// [B * L_out, C_in * K] (column c * K + k, zeros where the field leaves the
// input), so y = cols w^T + bias, dw += dy^T cols and dcols = dy w, which
// col2im adds back into dx (fp32 sums per sequence, rounded once into dx).
#include <algorithm>
#include <vector>

#include "moetron/kernels/conv1d.h"
#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/matmul.h"

namespace moetron::kernels::cpu {

namespace {

constexpr int64_t kParallelElems = 16384;

struct Dims {
  int64_t B, L, C, O, K, l_out;
};

Dims dims_of(const Tensor& x, const Tensor& w, int64_t l_out) {
  return {x.dim(0), x.dim(1), x.dim(2), w.dim(0), w.dim(2), l_out};
}

void check_dtypes(const char* fn, const Tensor& x, std::initializer_list<const Tensor*> same) {
  MOETRON_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, fn,
                ": the CPU backend takes f32, bf16 or f16, got ", x.str());
  for (const Tensor* t : same) {
    MOETRON_CHECK(t->dtype() == x.dtype(), fn, ": ", t->str(), " must have x's dtype ",
                  dtype_name(x.dtype()));
  }
}

// cols [B * L_out, C * K] in x's dtype.
Tensor im2col(const Tensor& x, const Dims& d, const Conv1dArgs& args) {
  Tensor cols = Tensor::empty({d.B * d.l_out, d.C * d.K}, x.dtype(), MemTag::workspace);
  dispatch_float(x.dtype(), "conv1d im2col", [&](auto tag) {
    using S = decltype(tag);
    const S* px = ptr<S>(x);
    S* pc = ptr<S>(cols);
    const S zero = from_f32<S>(0.0f);
#pragma omp parallel for schedule(static) if (cols.numel() > kParallelElems)
    for (int64_t r = 0; r < d.B * d.l_out; ++r) {
      const int64_t b = r / d.l_out, t = r % d.l_out;
      S* row = pc + r * d.C * d.K;
      for (int64_t k = 0; k < d.K; ++k) {
        const int64_t p = t * args.stride - args.padding + k;
        const bool inside = p >= 0 && p < d.L;
        const S* src = px + (b * d.L + p) * d.C;
        for (int64_t c = 0; c < d.C; ++c) row[c * d.K + k] = inside ? src[c] : zero;
      }
    }
  });
  return cols;
}

// dx[b, p, c] = sum over (t, k) with t * stride - padding + k = p of dcols[b * L_out + t, c * K +
// k].
void col2im(const Tensor& dcols, const Dims& d, const Conv1dArgs& args, const Tensor& dx) {
  const float* pd = ptr<float>(dcols);
  dispatch_float(dx.dtype(), "conv1d col2im", [&](auto tag) {
    using S = decltype(tag);
    S* pdx = ptr<S>(dx);
#pragma omp parallel for schedule(static) if (dcols.numel() > kParallelElems)
    for (int64_t b = 0; b < d.B; ++b) {
      std::vector<float> acc(static_cast<size_t>(d.L * d.C), 0.0f);
      for (int64_t t = 0; t < d.l_out; ++t) {
        const float* row = pd + (b * d.l_out + t) * d.C * d.K;
        for (int64_t k = 0; k < d.K; ++k) {
          const int64_t p = t * args.stride - args.padding + k;
          if (p < 0 || p >= d.L) continue;
          float* dst = acc.data() + p * d.C;
          for (int64_t c = 0; c < d.C; ++c) dst[c] += row[c * d.K + k];
        }
      }
      S* out = pdx + b * d.L * d.C;
      for (int64_t i = 0; i < d.L * d.C; ++i) out[i] = from_f32<S>(acc[static_cast<size_t>(i)]);
    }
  });
}

}  // namespace

void conv1d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Conv1dArgs& args, const Tensor& y) {
  const int64_t l_out = check_conv1d_shapes("conv1d_forward", x, w, bias, args, y);
  check_dtypes("conv1d_forward", x, {&w, &bias, &y});
  const Dims d = dims_of(x, w, l_out);
  if (y.numel() == 0) return;
  // Every output row starts as the bias; the GEMM adds onto it (beta = 1).
  dispatch_float(y.dtype(), "conv1d_forward", [&](auto tag) {
    using S = decltype(tag);
    const S* pb = ptr<S>(bias);
    S* py = ptr<S>(y);
    for (int64_t r = 0; r < d.B * d.l_out; ++r) std::copy(pb, pb + d.O, py + r * d.O);
  });
  const Tensor cols = im2col(x, d, args);
  MatmulArgs gemm;
  gemm.trans_b = true;
  gemm.beta = 1.0f;
  kernels::matmul(ctx, cols, w.reshape({d.O, d.C * d.K}), y.reshape({d.B * d.l_out, d.O}), gemm);
}

void conv1d_backward(Context& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                     const Conv1dArgs& args, const Tensor& dx, const Tensor& dw,
                     const Tensor& dbias) {
  const int64_t l_out = check_conv1d_shapes("conv1d_backward", x, w, dbias, args, dy);
  check_dtypes("conv1d_backward", x, {&w, &dy});
  check_tensor(dw, "conv1d dw", w.shape(), DType::f32);
  check_tensor(dbias, "conv1d dbias", {w.dim(0)}, DType::f32);
  if (dx.defined()) check_tensor(dx, "conv1d dx", x.shape(), x.dtype());
  const Dims d = dims_of(x, w, l_out);
  const int64_t rows = d.B * d.l_out;
  const Tensor dy2 = dy.reshape({rows, d.O});
  float* pdb = ptr<float>(dbias);
  dispatch_float(dy.dtype(), "conv1d_backward", [&](auto tag) {
    using S = decltype(tag);
    const S* pdy = ptr<S>(dy);
#pragma omp parallel for schedule(static) if (dy.numel() > kParallelElems)
    for (int64_t o = 0; o < d.O; ++o) {
      float sum = 0.0f;
      for (int64_t r = 0; r < rows; ++r) sum += to_f32(pdy[r * d.O + o]);
      pdb[o] += sum;
    }
  });
  if (rows == 0) {
    if (dx.defined()) dx.fill(0.0);
    return;
  }
  const Tensor cols = im2col(x, d, args);
  MatmulArgs wgrad;
  wgrad.trans_a = true;
  wgrad.beta = 1.0f;
  kernels::matmul(ctx, dy2, cols, dw.reshape({d.O, d.C * d.K}), wgrad);
  if (!dx.defined()) return;
  Tensor dcols = Tensor::empty({rows, d.C * d.K}, DType::f32, MemTag::workspace);
  kernels::matmul(ctx, dy2, w.reshape({d.O, d.C * d.K}), dcols, MatmulArgs{});
  col2im(dcols, d, args, dx);
}

}  // namespace moetron::kernels::cpu
