// CPU matmul family on oneDNN: shapes are validated here and mapped onto
// gemm() (cpu/matmul_gemm.h), which owns the primitives and their cache.
// oneDNN threads each GEMM itself with OpenMP, so grouped GEMMs run their
// groups one after another, each using every thread.
#include "moetron/kernels/matmul.h"

#include "moetron/kernels/cpu/cpu_state.h"
#include "moetron/kernels/cpu/matmul_gemm.h"
#include "moetron/kernels/matmul_shapes.h"

namespace moetron::kernels::cpu {

namespace {
const char* bytes_at(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.raw()) + elements * static_cast<int64_t>(t.element_size());
}
char* bytes_at_mut(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw()) + elements * static_cast<int64_t>(t.element_size());
}
}  // namespace

void matmul(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
            const MatmulArgs& args) {
  const MatmulDims d = check_matmul(a, b, c, args, DtypePolicy::cpu);
  GemmSpec s;
  s.batch = d.batch;
  s.b_batched = d.b_batched;
  s.m = d.m;
  s.n = d.n;
  s.k = d.k;
  s.trans_a = args.trans_a;
  s.trans_b = args.trans_b;
  s.ab = a.dtype();
  s.c = c.dtype();
  s.alpha = args.alpha;
  s.beta = args.beta;
  // A shared b with a row-major a is one tall GEMM: [batch * m, k] x [k, n]
  // uses the whole machine better than batch small ones.
  if (!d.b_batched && !args.trans_a && d.batch > 1) {
    s.m *= s.batch;
    s.batch = 1;
  }
  gemm(ctx.cpu_state(), s, a.raw(), b.raw(), c.raw());
}

void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w,
                    std::span<const int64_t> offsets, const Tensor& y, bool trans_w, float beta) {
  const GroupedDims d = check_grouped_matmul(x, w, offsets, y, trans_w, DtypePolicy::cpu);
  CpuState& st = ctx.cpu_state();
  for (int64_t e = 0; e < d.groups; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;  // y has no rows for this group: nothing to write
    GemmSpec s;
    s.m = rows;
    s.n = d.n;
    s.k = d.k;
    s.trans_b = trans_w;
    s.ab = x.dtype();
    s.c = y.dtype();
    s.beta = beta;
    gemm(st, s, bytes_at(x, offsets[e] * d.k), bytes_at(w, e * d.n * d.k),
         bytes_at_mut(y, offsets[e] * d.n), VaryingDim::m);
  }
}

void grouped_matmul_weight_grad(Context& ctx, const Tensor& dy, const Tensor& x,
                                std::span<const int64_t> offsets, const Tensor& dw, float beta) {
  const GroupedDims d = check_grouped_weight_grad(dy, x, offsets, dw, DtypePolicy::cpu);
  CpuState& st = ctx.cpu_state();
  for (int64_t e = 0; e < d.groups; ++e) {
    // dw_e [n, k] = dy_e^T [n, rows] x_e [rows, k]: dy_e stored [rows, n] is
    // the transposed operand. rows == 0 leaves beta * dw_e (gemm's k == 0).
    GemmSpec s;
    s.m = d.n;
    s.n = d.k;
    s.k = offsets[e + 1] - offsets[e];
    s.trans_a = true;
    s.ab = dy.dtype();
    s.c = dw.dtype();  // bf16: gemm sums in fp32 and rounds once into dw (with beta * dw)
    s.beta = beta;
    gemm(st, s, bytes_at(dy, offsets[e] * d.n), bytes_at(x, offsets[e] * d.k),
         bytes_at_mut(dw, e * d.n * d.k), VaryingDim::k);
  }
}

}  // namespace moetron::kernels::cpu
