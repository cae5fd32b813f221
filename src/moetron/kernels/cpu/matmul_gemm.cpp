#include "moetron/kernels/cpu/matmul_gemm.h"

#include <omp.h>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/vec_math.h"

namespace moetron::kernels::cpu {

namespace {

using dnnl::memory;

constexpr int64_t kKindGemm = 0x67656d6d;  // "gemm": field 0 of every key made here
constexpr int64_t kRuntime = -1;           // the varying dim is a run-time value
constexpr int64_t kAnyValue = -2;          // family key: the varying dim masked out

// Everything the primitive depends on. The thread count is part of it:
// brgemm fixes its work split when created, so a primitive made under one
// OpenMP thread count would ignore a later, larger one.
PrimitiveKey make_key(const GemmSpec& s, VaryingDim which, int64_t value) {
  PrimitiveKey key;
  auto& f = key.f;
  f[0] = kKindGemm;
  f[1] = omp_get_max_threads();
  f[2] = s.batch;
  f[3] = s.b_batched;
  f[4] = which == VaryingDim::m ? value : s.m;
  f[5] = s.n;
  f[6] = which == VaryingDim::k ? value : s.k;
  f[7] = s.trans_a;
  f[8] = s.trans_b;
  f[9] = static_cast<int64_t>(s.ab);
  f[10] = static_cast<int64_t>(s.c);
  f[11] = float_bits(s.alpha);
  f[12] = float_bits(s.beta);
  return key;
}

dnnl::primitive create(CpuState& st, const GemmSpec& s, VaryingDim runtime) {
  const GemmDescs d = gemm_descs(s, to_dnnl(s.c), runtime);
  dnnl::primitive_attr attr;
  // dst = alpha * acc (output scale) + beta * dst (sum post-op): oneDNN 2.x
  // applies output scales to the accumulator before post-ops.
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(s.beta);
    attr.set_post_ops(po);
  }
  try {
    return dnnl::matmul(
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(d.a, d.b, d.c), attr, st.engine));
  } catch (const dnnl::error& e) {
    MOETRON_FAIL("gemm: oneDNN cannot create a matmul for m=", s.m, " n=", s.n, " k=", s.k,
                 " batch=", s.batch, " ", dtype_name(s.ab), " -> ", dtype_name(s.c), ": ",
                 e.what());
  }
}

CachedPrimitive& lookup(CpuState& st, const GemmSpec& s, VaryingDim varying) {
  auto& cache = st.keyed_primitives;
  if (varying != VaryingDim::none) {
    // One primitive per family with the varying dimension given at run time.
    // Choosing exact-shape primitives for some sizes and this one for others
    // would make the arithmetic (blocking, summation order) depend on which
    // sizes earlier steps happened to see, and a resumed run would then not
    // repeat the uninterrupted one bit for bit.
    const PrimitiveKey rt = make_key(s, varying, kRuntime);
    auto it = cache.find(rt);
    if (it == cache.end())
      it = cache.emplace(rt, CachedPrimitive{create(st, s, varying), {}}).first;
    return it->second;
  }
  const PrimitiveKey exact = make_key(s, VaryingDim::none, 0);
  if (auto it = cache.find(exact); it != cache.end()) return it->second;
  // Fixed shape: the memory objects are part of the entry (null data for now).
  const GemmDescs d = gemm_descs(s, to_dnnl(s.c));
  CachedPrimitive entry{create(st, s, VaryingDim::none),
                        {{DNNL_ARG_SRC, memory(d.a, st.engine, nullptr)},
                         {DNNL_ARG_WEIGHTS, memory(d.b, st.engine, nullptr)},
                         {DNNL_ARG_DST, memory(d.c, st.engine, nullptr)}}};
  return cache.emplace(exact, std::move(entry)).first->second;
}

// c = s + beta * c into bf16 (beta == 0: c not read). Rounds to nearest even.
void store_bf16(const float* src, uint16_t* c, int64_t n, float beta) {
  const int64_t full = n / 16 * 16;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < full; i += 16) {
    simd::vf v = simd::load(src + i);
    if (beta != 0.0f)
      v = simd::fmadd(simd::set1(beta), simd::load(reinterpret_cast<const bf16*>(c + i)), v);
    simd::store(reinterpret_cast<bf16*>(c + i), v);
  }
  if (full < n) {
    const simd::mask16 m = simd::first_lanes(n - full);
    simd::vf v = simd::load(src + full, m);
    if (beta != 0.0f)
      v = simd::fmadd(simd::set1(beta), simd::load(reinterpret_cast<const bf16*>(c + full), m), v);
    simd::store(reinterpret_cast<bf16*>(c + full), v, m);
  }
}

// n bf16 values widened to fp32 (exact).
void widen_bf16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const bf16*>(src);
  const int64_t full = n / 16 * 16;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < full; i += 16) simd::store(dst + i, simd::load(s + i));
  if (full < n) {
    const simd::mask16 m = simd::first_lanes(n - full);
    simd::store(dst + full, simd::load(s + full, m), m);
  }
}

// k == 0: the product is empty, c = beta * c.
void scale_only(const GemmSpec& s, void* c) {
  const int64_t n = s.batch * s.m * s.n;
  if (s.c == DType::f32) {
    float* p = static_cast<float*>(c);
    for (int64_t i = 0; i < n; ++i) p[i] = s.beta == 0.0f ? 0.0f : s.beta * p[i];
  } else {
    uint16_t* p = static_cast<uint16_t*>(c);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = s.beta == 0.0f ? uint16_t{0} : f32_to_bf16(s.beta * bf16_to_f32(p[i]));
    }
  }
}

}  // namespace

memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::f32:
      return memory::data_type::f32;
    case DType::bf16:
      return memory::data_type::bf16;
    default:
      break;
  }
  MOETRON_FAIL("gemm: oneDNN matmul takes f32 or bf16, got ", dtype_name(t));
}

GemmDescs gemm_descs(const GemmSpec& s, memory::data_type c_dtype, VaryingDim runtime) {
  constexpr int64_t R = DNNL_RUNTIME_DIM_VAL;
  const int64_t m = runtime == VaryingDim::m ? R : s.m;
  const int64_t k = runtime == VaryingDim::k ? R : s.k;
  const int64_t n = s.n;
  auto mul = [](int64_t x, int64_t y) { return x == R || y == R ? R : x * y; };
  const auto ab = to_dnnl(s.ab);
  // Logical a is [m, k] and b [k, n]; a transposed operand is the same
  // logical matrix read with swapped strides.
  const memory::dims a_str = s.trans_a ? memory::dims{1, m} : memory::dims{k, 1};
  const memory::dims b_str = s.trans_b ? memory::dims{1, k} : memory::dims{n, 1};
  if (s.batch == 1) {
    return {memory::desc({m, k}, ab, a_str), memory::desc({k, n}, ab, b_str),
            memory::desc({m, n}, c_dtype, memory::dims{n, 1})};
  }
  const int64_t bb = s.b_batched ? s.batch : 1;
  return {memory::desc({s.batch, m, k}, ab, {mul(m, k), a_str[0], a_str[1]}),
          memory::desc({bb, k, n}, ab, {mul(k, n), b_str[0], b_str[1]}),
          memory::desc({s.batch, m, n}, c_dtype, {mul(m, n), n, 1})};
}

// Asked once per state: whether oneDNN can build a bf16 matmul here.
bool has_native_bf16_matmul(CpuState& st) {
  if (st.native_bf16_matmul < 0) {
    GemmSpec probe;
    probe.m = probe.n = probe.k = 16;
    probe.ab = DType::bf16;
    const GemmDescs d = gemm_descs(probe, memory::data_type::f32);
    try {
      (void)dnnl::matmul::primitive_desc(dnnl::matmul::desc(d.a, d.b, d.c), st.engine);
      st.native_bf16_matmul = 1;
    } catch (const dnnl::error&) {
      st.native_bf16_matmul = 0;
    }
  }
  return st.native_bf16_matmul == 1;
}

GemmSlots gemm_slots(const GemmSpec& s, bool widens) {
  GemmSlots g;
  if (s.batch == 0 || s.m == 0 || s.n == 0 || s.k == 0) return g;  // gemm() stops before
  const bool widen = s.ab == DType::bf16 && widens;
  if (widen) {
    g.widened_a = s.batch * s.m * s.k;
    g.widened_b = (s.b_batched ? s.batch : 1) * s.k * s.n;
  }
  if ((widen || s.ab == DType::f32) && s.c == DType::bf16) g.staged_out = s.batch * s.m * s.n;
  return g;
}

void gemm(CpuState& st, const GemmSpec& s, const void* a, const void* b, void* c,
          VaryingDim varying) {
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  if (s.k == 0) return scale_only(s, c);
  if (s.ab == DType::bf16 && !has_native_bf16_matmul(st)) {
    // Products of bf16 values are exact in fp32, so widening the operands
    // and running the fp32 matmul computes what a bf16 x bf16 -> fp32
    // matmul does (up to the order of its fp32 sums).
    const GemmSlots slots = gemm_slots(s, true);
    float* wa = st.scratch_f32(slots.widened_a, 1);
    float* wb = st.scratch_f32(slots.widened_b, 2);
    widen_bf16(a, wa, slots.widened_a);
    widen_bf16(b, wb, slots.widened_b);
    GemmSpec p = s;
    p.ab = DType::f32;
    return gemm(st, p, wa, wb, c, varying);
  }
  // oneDNN 2.6 has no f32 x f32 -> bf16 matmul: compute fp32 into scratch,
  // then add beta * c and round into c in one pass.
  const bool staged = s.ab == DType::f32 && s.c == DType::bf16;
  GemmSpec p = s;
  if (staged) {
    p.c = DType::f32;
    p.beta = 0.0f;
  }
  CachedPrimitive& entry = lookup(st, p, varying);
  void* dst = staged ? st.scratch_f32(gemm_slots(s, false).staged_out) : c;
  if (!entry.args.empty()) {
    entry.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<void*>(a));
    entry.args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<void*>(b));
    entry.args.at(DNNL_ARG_DST).set_data_handle(dst);
    entry.primitive.execute(st.stream, entry.args);
  } else {
    const GemmDescs d = gemm_descs(p, to_dnnl(p.c));
    entry.primitive.execute(st.stream,
                            {{DNNL_ARG_SRC, memory(d.a, st.engine, const_cast<void*>(a))},
                             {DNNL_ARG_WEIGHTS, memory(d.b, st.engine, const_cast<void*>(b))},
                             {DNNL_ARG_DST, memory(d.c, st.engine, dst)}});
  }
  st.stream.wait();
  if (staged)
    store_bf16(static_cast<const float*>(dst), static_cast<uint16_t*>(c), s.batch * s.m * s.n,
               s.beta);
}

}  // namespace moetron::kernels::cpu
