#include "moetron/optim/loss_scaler.h"

namespace moetron::optim {

bool LossScaler::update(bool grads_finite) {
  if (!grads_finite) {
    scale_ *= 0.5;
    clean_steps_ = 0;
    ++overflow_steps_;
    return false;
  }
  if (++clean_steps_ >= growth_interval_) {
    scale_ *= 2.0;
    clean_steps_ = 0;
  }
  return true;
}

}  // namespace moetron::optim
