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
inline void sincos16(__m512 a, __m512* sin_out, __m512* cos_out) {
  const __m512 two_over_pi = _mm512_set1_ps(0.636619772367581343f);
  const __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(a, two_over_pi),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(q, _mm512_set1_ps(1.5707963705062866f), a);
  r = _mm512_fnmadd_ps(q, _mm512_set1_ps(-4.371138828673793e-08f), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 ps = _mm512_set1_ps(-1.9515295891e-4f);
  ps = _mm512_fmadd_ps(ps, z, _mm512_set1_ps(8.3321608736e-3f));
  ps = _mm512_fmadd_ps(ps, z, _mm512_set1_ps(-1.6666654611e-1f));
  const __m512 sin_r = _mm512_fmadd_ps(_mm512_mul_ps(ps, z), r, r);
  __m512 pc = _mm512_set1_ps(2.443315711809948e-5f);
  pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(-1.388731625493765e-3f));
  pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(4.166664568298827e-2f));
  __m512 cos_r = _mm512_mul_ps(_mm512_mul_ps(pc, z), z);
  cos_r = _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), z, cos_r);
  cos_r = _mm512_add_ps(cos_r, _mm512_set1_ps(1.0f));
  // quadrant q mod 4: sin a = (sin r, cos r, -sin r, -cos r), cos a = (cos r, -sin r, -cos r, sin r)
  const __m512i qi = _mm512_cvtps_epi32(q);
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
  const __mmask16 odd = _mm512_test_epi32_mask(qi, one);
  const __mmask16 sin_neg = _mm512_test_epi32_mask(qi, two);
  const __mmask16 cos_neg = _mm512_test_epi32_mask(_mm512_add_epi32(qi, one), two);
  const __m512 s = _mm512_mask_blend_ps(odd, sin_r, cos_r);
  const __m512 c = _mm512_mask_blend_ps(odd, cos_r, sin_r);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  *sin_out = _mm512_mask_xor_ps(s, sin_neg, s, sign);
  *cos_out = _mm512_mask_xor_ps(c, cos_neg, c, sign);
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
    inv_freq[i] = static_cast<float>(
        std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
  }
  // Per-thread cos/sin of the current token's angles: [threads, 2 * half].
  Tensor table = Tensor::empty({omp_get_max_threads(), 2 * half}, DType::f32, MemTag::workspace);
  float* ptable = ptr<float>(table);
  const int32_t* pos = ptr<int32_t>(positions);
  dispatch_f32_bf16(src.dtype(), fn, [&](auto tag) {
    using S = decltype(tag);
    const S* ps = ptr<S>(src);
    S* pd = ptr<S>(dst);
#pragma omp parallel for schedule(static) firstprivate(H, hd, half, ps, pd, pos, inv_freq, ptable, direction) \
    if (T * H * hd > kParallelElems)
    for (int64_t t = 0; t < T; ++t) {
      float* cs = ptable + omp_get_thread_num() * 2 * half;
      float* sn = cs + half;
      const __m512 p = _mm512_set1_ps(static_cast<float>(pos[t]));
      const __m512 dir = _mm512_set1_ps(direction);
      for (int64_t i = 0; i < half; i += 16) {
        const __mmask16 m = lane_mask(half - i);
        __m512 s, c;
        sincos16(_mm512_mul_ps(p, load16(inv_freq + i, m)), &s, &c);
        store16(cs + i, c, m);
        store16(sn + i, _mm512_mul_ps(s, dir), m);
      }
      for (int64_t h = 0; h < H; ++h) {
        const S* xr = ps + (t * H + h) * hd;
        S* yr = pd + (t * H + h) * hd;
        for (int64_t i = 0; i < half; i += 16) {
          const __mmask16 m = lane_mask(half - i);
          const __m512 c = load16(cs + i, m), s = load16(sn + i, m);
          // Both halves are loaded before either is stored: dst may alias src.
          const __m512 x1 = load16(xr + i, m), x2 = load16(xr + half + i, m);
          store16(yr + i, _mm512_fmsub_ps(x1, c, _mm512_mul_ps(x2, s)), m);
          store16(yr + half + i, _mm512_fmadd_ps(x2, c, _mm512_mul_ps(x1, s)), m);
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
