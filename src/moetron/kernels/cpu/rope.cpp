// Rotary embedding on the CPU. Per token, the hd/2 angles p * inv_freq_i are
// formed in fp32 (inv_freq rounded once from double) and their sin/cos come
// from a vectorised sincos, then every head of the token reuses them. The
// fp32 angle is off by up to ~2^-23 * p rad, which dominates the error at
// large positions (4.9e-4 rad at p = 4096); the sincos itself adds ~1e-7.
#include <omp.h>

#include <cmath>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/rope.h"

namespace moetron::kernels::cpu {

namespace {

constexpr int64_t kParallelElems = 16384;

// sin and cos of 16 floats. Cody-Waite reduction a = q pi/2 + r with pi/2 in
// two floats (the second product exact in an FMA), |r| <= pi/4, then the
// minimax polynomials of Cephes sinf/cosf (~1 ulp on that interval) and a
// quadrant fix-up. Accurate for |a| up to ~1e6, far beyond what fp32
// angles can resolve anyway.
inline void sincos16(simd::vf a, simd::vf* sin_out, simd::vf* cos_out) {
  const simd::vf two_over_pi = simd::set1(0.636619772367581343f);
  const simd::vf q = simd::round_even(simd::mul(a, two_over_pi));
  simd::vf r = simd::fnmadd(q, simd::set1(1.5707963705062866f), a);
  r = simd::fnmadd(q, simd::set1(-4.371138828673793e-08f), r);
  const simd::vf z = simd::mul(r, r);
  simd::vf ps = simd::set1(-1.9515295891e-4f);
  ps = simd::fmadd(ps, z, simd::set1(8.3321608736e-3f));
  ps = simd::fmadd(ps, z, simd::set1(-1.6666654611e-1f));
  const simd::vf sin_r = simd::fmadd(simd::mul(ps, z), r, r);
  simd::vf pc = simd::set1(2.443315711809948e-5f);
  pc = simd::fmadd(pc, z, simd::set1(-1.388731625493765e-3f));
  pc = simd::fmadd(pc, z, simd::set1(4.166664568298827e-2f));
  simd::vf cos_r = simd::mul(simd::mul(pc, z), z);
  cos_r = simd::fnmadd(simd::set1(0.5f), z, cos_r);
  cos_r = simd::add(cos_r, simd::set1(1.0f));
  // quadrant q mod 4: sin a = (sin r, cos r, -sin r, -cos r), cos a = (cos r, -sin r, -cos r, sin
  // r)
  const simd::vi qi = simd::to_int(q), qi1 = simd::to_int(simd::add(q, simd::set1(1.0f)));
  const simd::mask16 odd = simd::test_bits(qi, 1);
  const simd::mask16 sin_neg = simd::test_bits(qi, 2);
  const simd::mask16 cos_neg = simd::test_bits(qi1, 2);
  const simd::vf s = simd::blend(odd, sin_r, cos_r);
  const simd::vf c = simd::blend(odd, cos_r, sin_r);
  *sin_out = simd::negate_where(sin_neg, s);
  *cos_out = simd::negate_where(cos_neg, c);
}

// direction +1 rotates by +a (forward), -1 by -a (backward).
void rope_rotate(const char* fn, const Tensor& src, const Tensor& positions, float theta,
                 const Tensor& dst, const char* dst_name, float direction) {
  MOETRON_CHECK(src.rank() == 3 && src.dim(2) % 2 == 0, fn,
                ": x must be [T, H, hd] with hd even, got ", src.str());
  check_tensor(dst, dst_name, src.shape(), src.dtype());
  const int64_t T = src.dim(0), H = src.dim(1), hd = src.dim(2), half = hd / 2;
  check_tensor(positions, "rope positions", {T}, DType::i32);
  if (T == 0 || half == 0 || H == 0) return;
  // inv_freq_i = theta^(-2i/hd), computed in double and rounded once.
  Tensor freq = Tensor::empty({half}, DType::f32, MemTag::workspace);
  float* inv_freq = ptr<float>(freq);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(
        static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
  }
  // Per-thread cos/sin of the current token's angles: [threads, 2 * half].
  Tensor table = Tensor::empty({omp_get_max_threads(), 2 * half}, DType::f32, MemTag::workspace);
  float* ptable = ptr<float>(table);
  const int32_t* pos = ptr<int32_t>(positions);
  dispatch_f32_bf16(src.dtype(), fn, [&](auto tag) {
    using S = decltype(tag);
    const S* ps = ptr<S>(src);
    S* pd = ptr<S>(dst);
#pragma omp parallel for schedule(static) firstprivate(H, hd, half, ps, pd, pos, inv_freq, ptable, \
                                                       direction) if (T * H * hd > kParallelElems)
    for (int64_t t = 0; t < T; ++t) {
      float* cs = ptable + omp_get_thread_num() * 2 * half;
      float* sn = cs + half;
      const simd::vf p = simd::set1(static_cast<float>(pos[t]));
      const simd::vf dir = simd::set1(direction);
      for (int64_t i = 0; i < half; i += 16) {
        const simd::mask16 m = lane_mask(half - i);
        simd::vf s, c;
        sincos16(simd::mul(p, load16(inv_freq + i, m)), &s, &c);
        store16(cs + i, c, m);
        store16(sn + i, simd::mul(s, dir), m);
      }
      for (int64_t h = 0; h < H; ++h) {
        const S* xr = ps + (t * H + h) * hd;
        S* yr = pd + (t * H + h) * hd;
        for (int64_t i = 0; i < half; i += 16) {
          const simd::mask16 m = lane_mask(half - i);
          const simd::vf c = load16(cs + i, m), s = load16(sn + i, m);
          // Both halves are loaded before either is stored: dst may alias src.
          const simd::vf x1 = load16(xr + i, m), x2 = load16(xr + half + i, m);
          store16(yr + i, simd::fmsub(x1, c, simd::mul(x2, s)), m);
          store16(yr + half + i, simd::fmadd(x2, c, simd::mul(x1, s)), m);
        }
      }
    }
  });
}

}  // namespace

void rope_forward(Context&, const Tensor& x, const Tensor& positions, float theta,
                  const Tensor& y) {
  rope_rotate("rope_forward", x, positions, theta, y, "rope y", 1.0f);
}

void rope_backward(Context&, const Tensor& dy, const Tensor& positions, float theta,
                   const Tensor& dx) {
  rope_rotate("rope_backward", dy, positions, theta, dx, "rope dx", -1.0f);
}

}  // namespace moetron::kernels::cpu
