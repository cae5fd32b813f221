// master = decay * master + alpha * update on the CPU: one streaming pass,
// 16-lane fp32 vectors, OpenMP over fixed blocks; a bf16 master is stored
// stochastically rounded.
#include "moetron/kernels/master_update.h"

#include <algorithm>
#include <type_traits>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/cpu/stochastic_store.h"

namespace moetron::kernels::cpu {

namespace {

constexpr int64_t kParallelElems = 32768;
constexpr int64_t kBlock = 4096;

template <typename W, typename U>
void update_loop(W* w, const U* u, int64_t n, float decay, float alpha, uint32_t key) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const simd::vf d = simd::set1(decay), a = simd::set1(alpha);
#pragma omp parallel for schedule(static) firstprivate(w, u, n, d, a, key) if (n > kParallelElems)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; i += 16) {
      const simd::mask16 mk = lane_mask(end - i);
      const simd::vf x = simd::fmadd(a, load16(u + i, mk), simd::mul(d, load16(w + i, mk)));
      if constexpr (std::is_same_v<W, bf16>) {
        store16_stochastic(w + i, x, end - i, key, i);
      } else {
        store16(w + i, x, mk);
      }
    }
  }
}

}  // namespace

void master_update(Context&, const Tensor& master, float decay, float alpha, const Tensor& update,
                   uint32_t key) {
  dispatch_f32_bf16(master.dtype(), "master_update master", [&](auto wtag) {
    using W = decltype(wtag);
    dispatch_f32_bf16(update.dtype(), "master_update update", [&](auto utag) {
      using U = decltype(utag);
      update_loop<W, U>(ptr<W>(master), ptr<U>(update), master.numel(), decay, alpha, key);
    });
  });
}

}  // namespace moetron::kernels::cpu
