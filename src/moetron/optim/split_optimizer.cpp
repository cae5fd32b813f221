#include "moetron/optim/split_optimizer.h"

#include <cmath>

namespace moetron::optim {

SplitOptimizer::SplitOptimizer(std::unique_ptr<ParamOptimizer> sharded, std::unique_ptr<ParamOptimizer> whole)
    : sharded_(std::move(sharded)), whole_(std::move(whole)) {
  MOETRON_CHECK(sharded_ && whole_, "SplitOptimizer needs both parts");
}

double SplitOptimizer::grad_norm(kernels::Context& ctx, double grad_scale) {
  // Local squares of the whole part: callers with replicas elsewhere (ep)
  // compute the global norm themselves and pass it to step().
  const double a = sharded_->grad_norm(ctx, grad_scale), b = whole_->grad_norm(ctx, grad_scale);
  return std::sqrt(a * a + b * b);
}

StepInfo SplitOptimizer::step(kernels::Context& ctx, int64_t step, double grad_scale, double known_norm) {
  const double norm = known_norm >= 0 ? known_norm : grad_norm(ctx, grad_scale);
  const StepInfo info = sharded_->step(ctx, step, grad_scale, norm);
  whole_->step(ctx, step, grad_scale, norm);
  return info;
}

std::vector<StateSlice> SplitOptimizer::state_slices() {
  std::vector<StateSlice> out = sharded_->state_slices();
  for (StateSlice& s : whole_->state_slices()) {
    s.replicated = true;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<StateTensor> SplitOptimizer::checkpoint_masters() {
  std::vector<StateTensor> out = sharded_->checkpoint_masters();
  for (StateTensor& t : whole_->checkpoint_masters()) out.push_back(std::move(t));
  return out;
}

void SplitOptimizer::load_master(const std::string& param_name, const Tensor& full) {
  // The sharded part takes part collectively in every load; the whole part only in its own.
  if (whole_->holds(param_name)) {
    whole_->load_master(param_name, full);
  } else {
    sharded_->load_master(param_name, full);
  }
}

void SplitOptimizer::finish_state_load() {
  sharded_->finish_state_load();
  whole_->finish_state_load();
}

bool SplitOptimizer::holds(const std::string& param_name) const {
  return sharded_->holds(param_name) || whole_->holds(param_name);
}

}  // namespace moetron::optim
