// master = decay * master + alpha * update in double; a bf16 master is
// rounded to fp32, then stochastically with the bits every backend draws.
#include "moetron/kernels/master_update.h"

#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

void master_update(Context&, const Tensor& master, float decay, float alpha, const Tensor& update,
                   uint32_t key) {
  MOETRON_CHECK(is_floating(master.dtype()) && is_floating(update.dtype()),
                "master_update: float tensors expected, got ", master.str(), " and ", update.str());
  const Tensor w = master.reshape({master.numel()});
  const Tensor u = update.reshape({update.numel()});
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double x =
        static_cast<double>(decay) * load(w, i) + static_cast<double>(alpha) * load(u, i);
    store_master(w, i, x, key);
  }
}

}  // namespace moetron::kernels::reference
