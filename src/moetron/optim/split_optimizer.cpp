#include "moetron/optim/split_optimizer.h"

#include <cmath>

namespace moetron::optim {

SplitOptimizer::SplitOptimizer(std::vector<Part> parts) : parts_(std::move(parts)) {
  MOETRON_CHECK(!parts_.empty(), "SplitOptimizer needs at least one part");
  for (const Part& p : parts_) MOETRON_CHECK(p.opt, "SplitOptimizer: a part has no optimizer");
}

double SplitOptimizer::grad_norm(kernels::Context& ctx, double grad_scale) {
  double sq = 0;
  for (Part& p : parts_) {
    const double n = p.opt->grad_norm(ctx, grad_scale);  // collective over the part's group
    sq += n * n;
  }
  return std::sqrt(sq);
}

StepInfo SplitOptimizer::step(kernels::Context& ctx, int64_t step, double grad_scale,
                              double known_norm) {
  const double norm = known_norm >= 0 ? known_norm : grad_norm(ctx, grad_scale);
  StepInfo info;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const StepInfo s = parts_[i].opt->step(ctx, step, grad_scale, norm);
    if (i == 0) info = s;
  }
  return info;
}

std::vector<StateSlice> SplitOptimizer::state_slices() {
  std::vector<StateSlice> out;
  for (Part& p : parts_) {
    for (StateSlice& s : p.opt->state_slices()) {
      s.replicated = p.replicated;
      out.push_back(std::move(s));
    }
  }
  return out;
}

bool SplitOptimizer::sharded() const {
  for (const Part& p : parts_) {
    if (p.opt->sharded()) return true;
  }
  return false;
}

std::vector<StateSlice> SplitOptimizer::checkpoint_masters() {
  std::vector<StateSlice> out;
  for (Part& p : parts_) {
    for (StateSlice& s : p.opt->checkpoint_masters()) {
      s.replicated = p.replicated;
      out.push_back(std::move(s));
    }
  }
  return out;
}

void SplitOptimizer::load_master(const std::string& param_name, const Tensor& local) {
  for (Part& p : parts_) {
    if (p.opt->holds(param_name)) return p.opt->load_master(param_name, local);
  }
  MOETRON_FAIL("optimizer has no parameter '", param_name, "'");
}

void SplitOptimizer::finish_state_load() {
  for (Part& p : parts_) p.opt->finish_state_load();
}

bool SplitOptimizer::holds(const std::string& param_name) const {
  for (const Part& p : parts_) {
    if (p.opt->holds(param_name)) return true;
  }
  return false;
}

}  // namespace moetron::optim
