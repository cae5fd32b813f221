// CUDA matmul on cuBLASLt. Row-major C = op(A) op(B) is computed as the
// column-major product C^T = op(B)^T op(A)^T, so cuBLASLt's first operand is
// our b and its second our a, each in the layout it is stored in. Inputs
// f32 (CUBLAS_COMPUTE_32F: true fp32, no TF32, as the CPU backend) or bf16
// (fp32 accumulation); outputs f32 or bf16 with alpha/beta in fp32.
// cuBLASLt has no f32-input bf16-output GEMM: that case runs into an f32
// scratch and matmul_epilogue.cu rounds alpha AB + beta C into c.
#include <cstdint>

#include "moetron/kernels/cuda/cuda_state.h"
#include "moetron/kernels/cuda/matmul_epilogue.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/matmul_shapes.h"

namespace moetron::kernels::cuda {

namespace {

// cuBLAS's recommended workspace for Hopper; Ampere needs less.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

void check_lt(cublasStatus_t st, const char* what) {
  MOETRON_CHECK(st == CUBLAS_STATUS_SUCCESS, "matmul: ", what, ": ", cublasLtGetStatusName(st),
                ": ", cublasLtGetStatusString(st));
}

// cuBLASLt assumes 256-byte aligned operands unless told otherwise, and
// slices of tensors are not: the heuristic must know the real alignment.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % static_cast<uintptr_t>(align) != 0) align /= 2;
  return align;
}

cudaDataType_t cuda_type(DType dt) {
  return dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Owners of cuBLASLt descriptors, so an exception leaks none.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  ~Layout() { cublasLtMatrixLayoutDestroy(d); }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  ~Preference() { cublasLtMatmulPreferenceDestroy(d); }
};

void make_layout(Layout& l, int type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  check_lt(cublasLtMatrixLayoutCreate(&l.d, static_cast<cudaDataType_t>(type),
                                      static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                              sizeof(count)),
             "batch count");
    check_lt(cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof(stride)),
             "batch stride");
  }
}

cublasLtMatmulAlgo_t choose_algo(CudaState& s, const GemmKey& key, const MatmulDesc& desc,
                                 const Layout& la, const Layout& lb, const Layout& lc) {
  if (auto it = s.gemm_algos.find(key); it != s.gemm_algos.end()) return it->second;
  Preference pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref.d), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kLtWorkspaceBytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws, sizeof(ws)),
           "workspace preference");
  const auto set_align = [&](cublasLtMatmulPreferenceAttributes_t attr, int align) {
    const auto v = static_cast<uint32_t>(align);
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.d, attr, &v, sizeof(v)),
             "alignment preference");
  };
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(s.lt, desc.d, la.d, lb.d, lc.d, lc.d, pref.d, 1, &result,
                                          &found),
           "cublasLtMatmulAlgoGetHeuristic");
  MOETRON_CHECK(found > 0, "matmul: cuBLASLt has no algorithm for m ", key.m, " n ", key.n, " k ",
                key.k, " (column-major), batch ", key.batch, ", alignments ", key.align_a, "/",
                key.align_b, "/", key.align_c);
  s.gemm_algos.emplace(key, result.algo);
  return result.algo;
}

// One cuBLASLt call in its own (column-major) terms: C = alpha op(A) op(B) + beta C.
void lt_gemm(CudaState& s, const GemmKey& key, const void* a, const void* b, void* c, float alpha,
             float beta) {
  if (!s.lt_workspace.defined())
    s.lt_workspace = scratch(s, {int64_t{kLtWorkspaceBytes}}, DType::u8);
  MatmulDesc desc;
  check_lt(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
           "transa");
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
           "transb");
  Layout la, lb, lc;
  make_layout(la, key.ab_type, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k, key.lda,
              key.batch, key.stride_a);
  make_layout(lb, key.ab_type, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n, key.ldb,
              key.batch, key.stride_b);
  make_layout(lc, key.c_type, key.m, key.n, key.ldc, key.batch, key.stride_c);
  const cublasLtMatmulAlgo_t algo = choose_algo(s, key, desc, la, lb, lc);
  check_lt(cublasLtMatmul(s.lt, desc.d, &alpha, a, la.d, b, lb.d, &beta, c, lc.d, c, lc.d, &algo,
                          s.lt_workspace.raw(), kLtWorkspaceBytes, s.stream.get()),
           "cublasLtMatmul");
}

// Our row-major problem (batch of m x k times k x n) as cuBLASLt's key:
// its A is our b, its B our a, its C our c seen as n x m column-major.
GemmKey make_key(const MatmulDims& d, int64_t batch, int64_t m, const MatmulArgs& args, DType ab,
                 DType c, const void* pa, const void* pb, const void* pc) {
  GemmKey k;
  k.ab_type = cuda_type(ab);
  k.c_type = cuda_type(c);
  k.trans_a = args.trans_b;
  k.trans_b = args.trans_a;
  k.m = d.n;
  k.n = m;
  k.k = d.k;
  k.batch = batch;
  k.lda = args.trans_b ? d.k : d.n;
  k.ldb = args.trans_a ? m : d.k;
  k.ldc = d.n;
  k.stride_a = batch > 1 ? d.k * d.n : 0;
  k.stride_b = m * d.k;
  k.stride_c = m * d.n;
  k.align_a = alignment_of(pb);
  k.align_b = alignment_of(pa);
  k.align_c = alignment_of(pc);
  return k;
}

}  // namespace

void matmul(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
            const MatmulArgs& args) {
  const MatmulDims d = check_matmul(a, b, c, args, DtypePolicy::cuda);
  check_on_device("matmul", {&a, &b, &c});
  CudaState& s = ctx.cuda_state();
  if (c.numel() == 0) return;
  if (d.k == 0) {  // an empty sum: c = beta c
    gemm_epilogue(s, c, nullptr, args.beta);
    return;
  }
  // f32 inputs into bf16: an f32 product in scratch, then one rounding.
  const bool staged = a.dtype() == DType::f32 && c.dtype() == DType::bf16;
  Tensor product = staged ? scratch(s, {c.numel()}, DType::f32) : Tensor();
  const Tensor& out = staged ? product : c;
  const float beta = staged ? 0.0f : args.beta;
  const size_t ea = a.element_size(), eo = out.element_size();
  const auto* pa = static_cast<const char*>(a.raw());
  auto* po = static_cast<char*>(out.raw());
  if (d.b_batched || d.batch == 1) {
    const GemmKey key = make_key(d, d.batch, d.m, args, a.dtype(), out.dtype(), pa, b.raw(), po);
    lt_gemm(s, key, b.raw(), pa, po, args.alpha, beta);
  } else if (!args.trans_a) {
    // One b shared by a row-major a: one tall GEMM [batch * m, k] x [k, n].
    const GemmKey key =
        make_key(d, 1, d.batch * d.m, args, a.dtype(), out.dtype(), pa, b.raw(), po);
    lt_gemm(s, key, b.raw(), pa, po, args.alpha, beta);
  } else {
    // A shared b with transposed a: one GEMM per batch (a stride-0 batch is
    // not a layout cuBLASLt documents).
    for (int64_t i = 0; i < d.batch; ++i) {
      const char* ai = pa + static_cast<size_t>(i * d.m * d.k) * ea;
      char* oi = po + static_cast<size_t>(i * d.m * d.n) * eo;
      const GemmKey key = make_key(d, 1, d.m, args, a.dtype(), out.dtype(), ai, b.raw(), oi);
      lt_gemm(s, key, b.raw(), ai, oi, args.alpha, beta);
    }
  }
  if (staged) gemm_epilogue(s, c, static_cast<const float*>(product.raw()), args.beta);
}

}  // namespace moetron::kernels::cuda
