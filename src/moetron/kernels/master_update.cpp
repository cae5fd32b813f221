#include "moetron/kernels/master_update.h"

namespace moetron::kernels {

void master_update(Context& ctx, const Tensor& master, float decay, float alpha,
                   const Tensor& update, uint32_t key) {
  MOETRON_CHECK(master.defined() && update.defined() && master.numel() == update.numel(),
                "master_update: update ", update.str(), " must have the master's ", master.str(),
                " element count");
  MOETRON_KERNEL_DISPATCH(ctx, master_update, master, decay, alpha, update, key);
}

}  // namespace moetron::kernels
