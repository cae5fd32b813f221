#include "moetron/kernels/matmul_shapes.h"

namespace moetron::kernels {

namespace {

const char* backend_of(DtypePolicy policy) {
  return policy == DtypePolicy::cuda ? "the CUDA backend" : "the CPU backend";
}

void check_input_dtypes(const Tensor& a, const char* an, const Tensor& b, const char* bn,
                        DtypePolicy policy, const char* fn) {
  MOETRON_CHECK(a.dtype() == b.dtype(), fn, ": ", an, " ", a.str(), " and ", bn, " ", b.str(),
                " must have the same dtype");
  if (policy != DtypePolicy::reference) {
    MOETRON_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::bf16, fn, ": ", an,
                  " must be f32 or bf16 on ", backend_of(policy), ", got ", a.str());
  } else {
    MOETRON_CHECK(is_floating(a.dtype()), fn, ": ", an, " must be a float tensor, got ", a.str());
  }
}

void check_output_dtype(const Tensor& c, const char* cn, DtypePolicy policy, const char* fn) {
  if (policy != DtypePolicy::reference) {
    MOETRON_CHECK(c.dtype() == DType::f32 || c.dtype() == DType::bf16, fn, ": ", cn,
                  " must be f32 or bf16 on ", backend_of(policy), ", got ", c.str());
  } else {
    MOETRON_CHECK(is_floating(c.dtype()), fn, ": ", cn, " must be a float tensor, got ", c.str());
  }
}

void check_offsets(std::span<const int64_t> offsets, int64_t groups, int64_t rows, const char* fn) {
  MOETRON_CHECK(static_cast<int64_t>(offsets.size()) == groups + 1, fn, ": offsets has ",
                offsets.size(), " entries, expected E + 1 = ", groups + 1);
  MOETRON_CHECK(offsets[0] == 0, fn, ": offsets[0] must be 0, got ", offsets[0]);
  for (int64_t e = 0; e < groups; ++e) {
    MOETRON_CHECK(offsets[e] <= offsets[e + 1], fn, ": offsets must be non-decreasing, offsets[", e,
                  "] = ", offsets[e], " > offsets[", e + 1, "] = ", offsets[e + 1]);
  }
  MOETRON_CHECK(offsets[groups] <= rows, fn, ": offsets[E] = ", offsets[groups], " exceeds the ",
                rows, " rows of the input");
}

}  // namespace

MatmulDims check_matmul(const Tensor& a, const Tensor& b, const Tensor& c, const MatmulArgs& args,
                        DtypePolicy policy) {
  check_input_dtypes(a, "a", b, "b", policy, "matmul");
  check_output_dtype(c, "c", policy, "matmul");
  MOETRON_CHECK(a.rank() >= 2, "matmul: a must have rank >= 2, got ", a.str());
  MOETRON_CHECK(b.rank() == 2 || b.rank() == a.rank(), "matmul: b must be 2-D or have a's rank ",
                a.rank(), ", got ", b.str());
  MatmulDims d;
  d.m = args.trans_a ? a.dim(-1) : a.dim(-2);
  d.k = args.trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = args.trans_b ? b.dim(-1) : b.dim(-2);
  d.n = args.trans_b ? b.dim(-2) : b.dim(-1);
  MOETRON_CHECK(kb == d.k, "matmul: inner dimensions differ: a ", a.str(),
                (args.trans_a ? " (trans)" : ""), " has K = ", d.k, ", b ", b.str(),
                (args.trans_b ? " (trans)" : ""), " has K = ", kb);
  Shape c_shape;
  for (int i = 0; i < a.rank() - 2; ++i) {
    c_shape.push_back(a.dim(i));
    d.batch *= a.dim(i);
  }
  d.b_batched = b.rank() > 2;
  if (d.b_batched) {
    for (int i = 0; i < a.rank() - 2; ++i) {
      MOETRON_CHECK(b.dim(i) == a.dim(i), "matmul: batch dims of a ", a.str(), " and b ", b.str(),
                    " differ");
    }
  }
  c_shape.push_back(d.m);
  c_shape.push_back(d.n);
  MOETRON_CHECK(c.shape() == c_shape, "matmul: c is ", c.str(), ", expected shape ", c_shape.str(),
                " for a ", a.str(), " and b ", b.str());
  return d;
}

GroupedDims check_grouped_matmul(const Tensor& x, const Tensor& w, std::span<const int64_t> offsets,
                                 const Tensor& y, bool trans_w, DtypePolicy policy) {
  check_input_dtypes(x, "x", w, "w", policy, "grouped_matmul");
  check_output_dtype(y, "y", policy, "grouped_matmul");
  MOETRON_CHECK(x.rank() == 2, "grouped_matmul: x must be [T, K], got ", x.str());
  MOETRON_CHECK(w.rank() == 3, "grouped_matmul: w must be [E, ", (trans_w ? "N, K" : "K, N"),
                "], got ", w.str());
  GroupedDims d;
  d.groups = w.dim(0);
  d.rows = x.dim(0);
  d.k = x.dim(1);
  d.n = trans_w ? w.dim(1) : w.dim(2);
  const int64_t kw = trans_w ? w.dim(2) : w.dim(1);
  MOETRON_CHECK(kw == d.k, "grouped_matmul: w ", w.str(), (trans_w ? " (trans)" : ""),
                " has K = ", kw, ", x ", x.str(), " has K = ", d.k);
  check_shape(y, "grouped_matmul: y", {d.rows, d.n});
  check_offsets(offsets, d.groups, d.rows, "grouped_matmul");
  return d;
}

GroupedDims check_grouped_weight_grad(const Tensor& dy, const Tensor& x,
                                      std::span<const int64_t> offsets, const Tensor& dw,
                                      DtypePolicy policy) {
  const char* fn = "grouped_matmul_weight_grad";
  check_input_dtypes(dy, "dy", x, "x", policy, fn);
  if (policy != DtypePolicy::reference) {
    MOETRON_CHECK(dw.dtype() == DType::f32 || dw.dtype() == DType::bf16, fn,
                  ": dw must be f32 or bf16 on ", backend_of(policy), ", got ", dw.str());
  } else {
    MOETRON_CHECK(dw.dtype() == DType::f32 || dw.dtype() == DType::bf16 || dw.dtype() == DType::f64,
                  fn, ": dw must be f32, bf16 or f64, got ", dw.str());
  }
  MOETRON_CHECK(dy.rank() == 2, fn, ": dy must be [T, N], got ", dy.str());
  MOETRON_CHECK(x.rank() == 2, fn, ": x must be [T, K], got ", x.str());
  MOETRON_CHECK(dw.rank() == 3, fn, ": dw must be [E, N, K], got ", dw.str());
  MOETRON_CHECK(dy.dim(0) == x.dim(0), fn, ": dy ", dy.str(), " and x ", x.str(),
                " differ in rows");
  GroupedDims d;
  d.groups = dw.dim(0);
  d.rows = x.dim(0);
  d.n = dy.dim(1);
  d.k = x.dim(1);
  check_shape(dw, "grouped_matmul_weight_grad: dw", {d.groups, d.n, d.k});
  check_offsets(offsets, d.groups, d.rows, fn);
  return d;
}

}  // namespace moetron::kernels
