// Dynamic loss scaling for fp16 training (the PyTorch GradScaler schedule in
// REFERENCE.md): the loss is multiplied by `scale` before backward so small
// gradients survive fp16; a step whose gradients overflowed is skipped and
// the scale halved; after `growth_interval` clean steps in a row it doubles.
#pragma once

#include <cstdint>

namespace moetron::optim {

class LossScaler {
 public:
  explicit LossScaler(double init_scale = 65536.0, int64_t growth_interval = 2000)
      : scale_(init_scale), growth_interval_(growth_interval) {}

  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_steps_; }
  int64_t overflow_steps() const { return overflow_steps_; }

  // Call once per step with whether every gradient is finite. Returns whether
  // the optimizer may apply this step.
  bool update(bool grads_finite);

  // Checkpointed state.
  void restore(double scale, int64_t clean_steps, int64_t overflow_steps) {
    scale_ = scale;
    clean_steps_ = clean_steps;
    overflow_steps_ = overflow_steps;
  }

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t clean_steps_ = 0;
  int64_t overflow_steps_ = 0;
};

}  // namespace moetron::optim
