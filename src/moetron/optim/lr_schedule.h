// Learning-rate schedule: linear warmup, then cosine decay to a floor.
#pragma once

#include <cstdint>

namespace moetron::optim {

struct LrSchedule {
  double peak_lr = 3e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // lr of optimizer step `step` (1-based): step/warmup * peak during warmup,
  // then peak * (r + (1 - r) * (1 + cos(pi * progress)) / 2), progress in [0, 1].
  double at(int64_t step) const;
};

}  // namespace moetron::optim
