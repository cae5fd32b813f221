// CPU attention (blockwise, online softmax) against the fp64 reference, the
// reference backward against finite differences, masks at their edges
// (fully masked rows, query chunks with an offset), and thread-count
// determinism of the backward.
#include "moetron/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// f32: the CPU kernel accumulates in f32 (scores, online-softmax rescaling,
// P V) against the reference's double; measured <= 7e-7 normalised, 1e-5
// leaves room for longer sums.
constexpr double kF32Norm = 1e-5;
constexpr test::Tolerance kF32Lse{1e-5, 1e-5};
// bf16: same bf16 inputs for both, but the CPU kernel rounds P and dS to
// bf16 (8 significant bits, 2^-9 relative each) before the P V, P^T dO,
// dS K and dS^T Q GEMMs, and rounds outputs to bf16; the reference rounds
// only its outputs. Two independent roundings of the output already differ
// by up to one bf16 ulp (2^-8 = 3.9e-3 of the largest entry); measured
// <= 7e-3 normalised over this suite, 1e-2 is the bf16 budget.
constexpr double kBf16Norm = 1e-2;
// lse is f32 in both; the CPU scores are f32 sums of exact bf16 products.
constexpr test::Tolerance kBf16Lse{1e-5, 1e-4};

struct Case {
  int64_t B, Sq, Sk, H, Hkv, hd;
  AttentionMask mask;
  std::string str() const {
    std::ostringstream os;
    os << "B" << B << " Sq" << Sq << " Sk" << Sk << " H" << H << "/" << Hkv << " hd" << hd
       << (mask.causal ? " causal" : " full") << " w" << mask.window << " g" << mask.num_global
       << " off" << mask.q_offset;
    return os.str();
  }
};

struct Outputs {
  Tensor out, lse, dq, dk, dv;
};

struct Inputs {
  Tensor q, k, v, dout;
};

Inputs make_inputs(const Case& c, DType dt) {
  // q in [-2, 2): peakier softmax rows than [-1, 1) exercise the max tracking.
  return {random_tensor({c.B, c.Sq, c.H, c.hd}, dt, "q", -2.0f, 2.0f),
          random_tensor({c.B, c.Sk, c.Hkv, c.hd}, dt, "k"),
          random_tensor({c.B, c.Sk, c.Hkv, c.hd}, dt, "v"),
          random_tensor({c.B, c.Sq, c.H, c.hd}, dt, "dout")};
}

float scale_of(const Case& c) {
  return 1.0f / std::sqrt(static_cast<float>(c.hd));
}

// Forward, then backward fed with that forward's own out and lse (as in
// training); `bwd_out` overrides the out/lse the backward sees.
Outputs run(Context& ctx, const Case& c, const Inputs& in, const Outputs* bwd_in = nullptr) {
  const DType dt = in.q.dtype();
  Outputs o{poisoned(in.q.shape(), dt), poisoned({c.B, c.H, c.Sq}, DType::f32),
            poisoned(in.q.shape(), dt), poisoned(in.k.shape(), dt), poisoned(in.k.shape(), dt)};
  attention_forward(ctx, in.q, in.k, in.v, c.mask, scale_of(c), o.out, o.lse);
  const Outputs& src = bwd_in ? *bwd_in : o;
  attention_backward(ctx, in.dout, in.q, in.k, in.v, src.out, src.lse, c.mask, scale_of(c), o.dq,
                     o.dk, o.dv);
  return o;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(test::element(t, i)));
  return m;
}

// NaN (an element never written) counts as an infinite difference.
double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(test::element(a, i) - test::element(b, i));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
    if (std::isinf(m)) break;
  }
  return m;
}

void expect_match(const Case& c, DType dt) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const Inputs in = make_inputs(c, dt);
  const Outputs got = run(cpu, c, in);
  // The reference backward sees the CPU forward's out (for D = rowsum(dO O)),
  // so both backwards differentiate at the same point.
  const Outputs want = run(ref, c, in, &got);
  const double norm = dt == DType::f32 ? kF32Norm : kBf16Norm;
  const auto lse_tol = dt == DType::f32 ? kF32Lse : kBf16Lse;
  const std::string what = c.str() + " " + std::string(dtype_name(dt));
  EXPECT_TRUE(test::normalized_close(got.out, want.out, norm)) << "out " << what;
  EXPECT_TRUE(test::all_close(got.lse, want.lse, lse_tol)) << "lse " << what;
  // Gradients are normalised by the largest entry of all three: dq and dk
  // can cancel to ~0 on their own (a row that sees one key has dS = 0
  // exactly), and then have no scale of their own to be relative to.
  const double gscale = std::max({max_abs(want.dq), max_abs(want.dk), max_abs(want.dv), 1e-30});
  EXPECT_LE(max_diff(got.dq, want.dq), norm * gscale) << "dq " << what;
  EXPECT_LE(max_diff(got.dk, want.dk), norm * gscale) << "dk " << what;
  EXPECT_LE(max_diff(got.dv, want.dv), norm * gscale) << "dv " << what;
}

AttentionMask mask_of(bool causal, int64_t window, int64_t global, int64_t offset = 0) {
  AttentionMask m;
  m.causal = causal;
  m.window = window;
  m.num_global = global;
  m.q_offset = offset;
  return m;
}

// Every mask kind at every awkward length; head_dim, kv heads and batch
// cycle through their awkward values so each appears with each mask.
TEST(Attention, MatchesReferenceAcrossMasksAndSizes) {
  const std::vector<AttentionMask> masks = {
      mask_of(false, 0, 0), mask_of(true, 0, 0), mask_of(true, 1, 0),  mask_of(true, 5, 0),
      mask_of(true, 16, 0), mask_of(true, 5, 1), mask_of(true, 16, 3), mask_of(false, 5, 3)};
  const std::vector<int64_t> hds = {8, 24, 64, 40, 17, 80};
  const std::vector<int64_t> hkvs = {4, 2, 1};
  int n = 0;
  for (const auto& m : masks) {
    for (int64_t S : test::kAwkwardSizes) {
      const Case c{1 + n % 2, S, S, 4, hkvs[n % 3], hds[n % 6], m};
      for (DType dt : {DType::f32, DType::bf16}) expect_match(c, dt);
      ++n;
    }
  }
}

// Document starts of B sequences of S tokens: documents of random lengths
// (1 .. 2 * mean), another layout in each sequence.
std::vector<int32_t> random_documents(int64_t B, int64_t S, int64_t mean, uint32_t seed) {
  std::vector<int32_t> starts(static_cast<size_t>(B * S));
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0, left = 0;
    for (int64_t p = 0; p < S; ++p) {
      if (left == 0) {
        x = x * 1664525u + 1013904223u;
        left = 1 + static_cast<int64_t>(x >> 8) % (2 * mean);
        start = p;
      }
      --left;
      starts[static_cast<size_t>(b * S + p)] = static_cast<int32_t>(start);
    }
  }
  return starts;
}

// Packed documents under every causal mask kind, documents shorter and
// longer than a 64-row tile, and a query chunk with an offset.
TEST(Attention, PackedDocumentsMatchReference) {
  const std::vector<AttentionMask> masks = {mask_of(true, 0, 0), mask_of(true, 5, 0),
                                            mask_of(true, 16, 3), mask_of(true, 70, 1)};
  int n = 0;
  for (const auto& base : masks) {
    for (const int64_t mean : {3, 40, 100}) {
      for (const int64_t S : {33, 130, 200}) {
        const std::vector<int32_t> starts = random_documents(2, S, mean, 7 + n);
        Case c{2, S, S, 4, 2, n % 2 ? 24 : 17, base};
        c.mask.doc_start = starts.data();
        c.mask.doc_stride = S;
        SCOPED_TRACE(testing::Message() << "mean document " << mean);
        for (DType dt : {DType::f32, DType::bf16}) expect_match(c, dt);
        // The last 70 queries of the same sequences.
        Case chunk = c;
        chunk.Sq = std::min<int64_t>(70, S);
        chunk.mask.q_offset = S - chunk.Sq;
        expect_match(chunk, DType::f32);
        ++n;
      }
    }
  }
}

TEST(Attention, BadDocumentStartsThrow) {
  Context cpu(Backend::cpu);
  const Case c{1, 4, 4, 1, 1, 8, mask_of(true, 0, 0)};
  const Inputs in = make_inputs(c, DType::f32);
  Tensor out = Tensor::empty({1, 4, 1, 8}, DType::f32), lse = Tensor::empty({1, 1, 4}, DType::f32);
  std::vector<int32_t> starts = {0, 0, 2, 1};  // decreasing
  AttentionMask m = c.mask;
  m.doc_start = starts.data();
  m.doc_stride = 4;
  EXPECT_THROW(attention_forward(cpu, in.q, in.k, in.v, m, 1.0f, out, lse), Error);
  starts = {0, 0, 3, 3};  // a start after its position
  EXPECT_THROW(attention_forward(cpu, in.q, in.k, in.v, m, 1.0f, out, lse), Error);
  starts = {0, 0, 2, 2};
  m.causal = false;
  EXPECT_THROW(attention_forward(cpu, in.q, in.k, in.v, m, 1.0f, out, lse), Error);
  m.causal = true;
  m.doc_stride = 3;
  EXPECT_THROW(attention_forward(cpu, in.q, in.k, in.v, m, 1.0f, out, lse), Error);
  m.doc_stride = 4;
  attention_forward(cpu, in.q, in.k, in.v, m, 1.0f, out, lse);
}

// A query chunk of a longer sequence (Sq < Sk, q_offset > 0), as chunked
// prefill or context-parallel attention calls it.
TEST(Attention, QueryChunkWithOffset) {
  const std::vector<AttentionMask> masks = {mask_of(true, 0, 0, 97), mask_of(true, 16, 3, 97),
                                            mask_of(false, 0, 0, 50), mask_of(false, 20, 2, 40),
                                            mask_of(true, 70, 0, 60)};
  for (const auto& m : masks) {
    const Case c{2, 33, 130, 4, 2, 24, m};
    for (DType dt : {DType::f32, DType::bf16}) expect_match(c, dt);
  }
}

// The last chunk of a long sequence under a window: key tiles 1 .. 3 (keys
// 64 .. 255) are seen by no query, only the global keys in tile 0 and the
// window's; the backward skips those tiles and their dK/dV must be zeros.
TEST(Attention, QueryChunkFarPastMostKeysUnderAWindow) {
  for (const auto& m : {mask_of(true, 16, 3, 260), mask_of(true, 40, 0, 260)}) {
    const Case c{2, 40, 300, 4, 2, 24, m};
    for (DType dt : {DType::f32, DType::bf16}) expect_match(c, dt);
  }
}

// A key block cut out of a longer sequence, as context-parallel attention
// calls it (nn/attention_context_parallel.cpp): keys 0 .. Sk - 1 of the
// block, queries q_offset further on, document starts in the block's
// coordinates and negative where a document began before the block, with a
// start row (doc_stride) longer than the block.
TEST(Attention, KeyBlockOfALongerSequence) {
  const std::vector<AttentionMask> masks = {mask_of(true, 0, 0, 150), mask_of(true, 120, 3, 150),
                                            mask_of(true, 16, 1, 40)};
  int n = 0;
  for (const auto& base : masks) {
    for (const int64_t mean : {5, 60}) {
      const int64_t len = base.q_offset + 37, block_start = 90;
      std::vector<int32_t> starts = random_documents(2, len, mean, 31 + n++);
      for (int32_t& st : starts) st -= block_start;
      Case c{2, 37, 70, 4, 2, 24, base};
      c.mask.doc_start = starts.data();
      c.mask.doc_stride = len;
      SCOPED_TRACE(testing::Message() << "mean document " << mean);
      for (DType dt : {DType::f32, DType::bf16}) expect_match(c, dt);
    }
  }
}

// Queries far past every key under a window see nothing: out 0, lse -inf,
// and no gradient. Row 0 of the mixed case sees one key, the others none.
TEST(Attention, FullyMaskedRowsGiveZeroOutputAndNegInfLse) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Case none{1, 7, 7, 2, 1, 16, mask_of(true, 5, 0, 20)};
    const Inputs in = make_inputs(none, dt);
    Context cpu(Backend::cpu);
    const Outputs got = run(cpu, none, in);
    for (int64_t i = 0; i < got.out.numel(); ++i) ASSERT_EQ(test::element(got.out, i), 0.0);
    for (int64_t i = 0; i < got.lse.numel(); ++i) {
      ASSERT_EQ(test::element(got.lse, i), -INFINITY);
    }
    for (const Tensor* g : {&got.dq, &got.dk, &got.dv}) {
      for (int64_t i = 0; i < g->numel(); ++i) ASSERT_EQ(test::element(*g, i), 0.0);
    }
    expect_match(none, dt);
    expect_match({2, 5, 7, 2, 2, 24, mask_of(true, 3, 0, 8)}, dt);
    expect_match({1, 70, 130, 4, 1, 33, mask_of(false, 3, 0, 100)}, dt);
  }
}

// loss = sum(out * w); d loss / d out = w, so the reference backward with
// dout = w must match central differences of the reference forward (f64).
TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  for (const auto& m : {mask_of(true, 2, 1), mask_of(false, 2, 1), mask_of(true, 0, 0, 2)}) {
    const Case c{1, 5, 7, 2, 1, 3, m};
    const Inputs in = make_inputs(c, DType::f64);
    const float scale = scale_of(c);
    Tensor out = poisoned(in.q.shape(), DType::f64), lse = poisoned({1, 2, 5}, DType::f64);
    auto loss = [&] {
      attention_forward(ref, in.q, in.k, in.v, m, scale, out, lse);
      double s = 0;
      for (int64_t i = 0; i < out.numel(); ++i)
        s += test::element(out, i) * test::element(in.dout, i);
      return s;
    };
    loss();
    Tensor dq = poisoned(in.q.shape(), DType::f64), dk = poisoned(in.k.shape(), DType::f64),
           dv = poisoned(in.k.shape(), DType::f64);
    attention_backward(ref, in.dout, in.q, in.k, in.v, out, lse, m, scale, dq, dk, dv);
    EXPECT_TRUE(test::finite_difference_check(loss, in.q, dq)) << "dq " << c.str();
    EXPECT_TRUE(test::finite_difference_check(loss, in.k, dk)) << "dk " << c.str();
    EXPECT_TRUE(test::finite_difference_check(loss, in.v, dv)) << "dv " << c.str();
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// dK/dV sums (over query blocks and over the heads of a group) are formed in
// a fixed order, so 1 and 2 threads give the same bits.
TEST(Attention, BackwardBitsDoNotDependOnThreadCount) {
  const Case c{2, 130, 130, 4, 2, 40, mask_of(true, 70, 3)};
  for (DType dt : {DType::f32, DType::bf16}) {
    const Inputs in = make_inputs(c, dt);
    Outputs one, two;
    {
      Context cpu(Backend::cpu, 1);
      one = run(cpu, c, in);
    }
    {
      Context cpu(Backend::cpu, 2);
      two = run(cpu, c, in);
    }
    EXPECT_TRUE(same_bits(one.out, two.out)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.lse, two.lse)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.dq, two.dq)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.dk, two.dk)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.dv, two.dv)) << dtype_name(dt);
  }
}

TEST(Attention, BadArgumentsThrow) {
  Context cpu(Backend::cpu);
  const Case c{1, 7, 7, 4, 2, 16, mask_of(true, 0, 0)};
  const Inputs in = make_inputs(c, DType::f32);
  Tensor out = poisoned(in.q.shape(), DType::f32), lse = poisoned({1, 4, 7}, DType::f32);
  const float s = scale_of(c);
  // lse in the wrong dtype / shape, out in the wrong dtype.
  EXPECT_THROW(
      attention_forward(cpu, in.q, in.k, in.v, c.mask, s, out, poisoned({1, 4, 7}, DType::bf16)),
      Error);
  EXPECT_THROW(
      attention_forward(cpu, in.q, in.k, in.v, c.mask, s, out, poisoned({1, 7, 4}, DType::f32)),
      Error);
  EXPECT_THROW(
      attention_forward(cpu, in.q, in.k, in.v, c.mask, s, poisoned(in.q.shape(), DType::bf16), lse),
      Error);
  // 4 query heads over 3 kv heads; head_dim mismatch; f64 on the CPU backend.
  Tensor k3 = random_tensor({1, 7, 3, 16}, DType::f32, "k");
  EXPECT_THROW(attention_forward(cpu, in.q, k3, k3, c.mask, s, out, lse), Error);
  Tensor k8 = random_tensor({1, 7, 2, 8}, DType::f32, "k");
  EXPECT_THROW(attention_forward(cpu, in.q, k8, k8, c.mask, s, out, lse), Error);
  const Inputs in64 = make_inputs(c, DType::f64);
  EXPECT_THROW(attention_forward(cpu, in64.q, in64.k, in64.v, c.mask, s,
                                 poisoned(in.q.shape(), DType::f64), lse),
               Error);
  // Backward with dk of the query shape.
  attention_forward(cpu, in.q, in.k, in.v, c.mask, s, out, lse);
  EXPECT_THROW(
      attention_backward(cpu, in.dout, in.q, in.k, in.v, out, lse, c.mask, s,
                         poisoned(in.q.shape(), DType::f32), poisoned(in.q.shape(), DType::f32),
                         poisoned(in.k.shape(), DType::f32)),
      Error);
}

}  // namespace
}  // namespace moetron::kernels
