// master = decay * master + alpha * update in double; a bf16 master is
// rounded to fp32, then stochastically with the bits every backend draws.
#include "moetron/kernels/master_update.h"

#include <cstring>

#include "moetron/kernels/reference/ref_util.h"
#include "moetron/kernels/stochastic_round.h"

namespace moetron::kernels::reference {

void master_update(Context&, const Tensor& master, float decay, float alpha, const Tensor& update,
                   uint32_t key) {
  MOETRON_CHECK(is_floating(master.dtype()) && is_floating(update.dtype()),
                "master_update: float tensors expected, got ", master.str(), " and ", update.str());
  const Tensor w = master.reshape({master.numel()});
  const Tensor u = update.reshape({update.numel()});
  const bool bf16_master = master.dtype() == DType::bf16;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double x =
        static_cast<double>(decay) * load(w, i) + static_cast<double>(alpha) * load(u, i);
    if (!bf16_master) {
      store(w, i, x);
      continue;
    }
    const auto x32 = static_cast<float>(x);
    uint32_t bits;
    std::memcpy(&bits, &x32, 4);
    w.data<bf16>()[i].bits =
        bf16_bits_stochastic(bits, rounding_bits(key, static_cast<uint32_t>(i)));
  }
}

}  // namespace moetron::kernels::reference
