// Two optimizers over disjoint parameters, seen as one: ZeRO-1 for the
// parameters every dp rank holds and a plain one for those only some ranks
// hold (the experts under expert parallelism: their replicas are reduced by
// their own all-reduce, and ZeRO's reduce-scatter chunks assume identical
// parameters on every rank of its group).
#pragma once

#include <memory>

#include "moetron/optim/optimizer.h"

namespace moetron::optim {

class SplitOptimizer final : public ParamOptimizer {
 public:
  // sharded: the ZeRO-1 part; whole: the other parameters (each held whole).
  SplitOptimizer(std::unique_ptr<ParamOptimizer> sharded, std::unique_ptr<ParamOptimizer> whole);

  double grad_norm(kernels::Context& ctx, double grad_scale) override;
  StepInfo step(kernels::Context& ctx, int64_t step, double grad_scale, double known_norm) override;
  const OptimizerOptions& options() const override { return sharded_->options(); }
  // The whole part's slices are marked replicated (stored once).
  std::vector<StateSlice> state_slices() override;
  bool sharded() const override { return true; }
  std::vector<StateTensor> checkpoint_masters() override;
  void load_master(const std::string& param_name, const Tensor& full) override;
  void finish_state_load() override;
  bool holds(const std::string& param_name) const override;
  ParamOptimizer& sharded_part() { return *sharded_; }

 private:
  std::unique_ptr<ParamOptimizer> sharded_, whole_;
};

}  // namespace moetron::optim
