// Optimizers over disjoint parameters, seen as one. Under ZeRO-1 each group
// of ranks holding a parameter identically shards its state: the dense
// parameters over dp, the tp-partial ones (router, shared experts: the same
// on every rank of a stage) over dp x tp; a plain optimizer updates those
// held by only some ranks of any group (the routed experts under expert
// parallelism: their replicas are reduced by their own all-reduce).
#pragma once

#include <memory>
#include <vector>

#include "moetron/optim/optimizer.h"

namespace moetron::optim {

class SplitOptimizer final : public ParamOptimizer {
 public:
  struct Part {
    std::unique_ptr<ParamOptimizer> opt;
    // Held whole by every rank that holds it (its state stored once, by the
    // rank the checkpoint's `writes` names).
    bool replicated = false;
  };
  explicit SplitOptimizer(std::vector<Part> parts);

  // Each part's norm as it computes it, combined: callers with replicas or
  // shards elsewhere (ep, tp, pp) compute the global norm themselves and
  // pass it to step().
  double grad_norm(kernels::Context& ctx, double grad_scale) override;
  StepInfo step(kernels::Context& ctx, int64_t step, double grad_scale, double known_norm) override;
  const OptimizerOptions& options() const override { return parts_.front().opt->options(); }
  std::vector<StateSlice> state_slices() override;
  bool sharded() const override;
  std::vector<StateSlice> checkpoint_masters() override;
  void load_master(const std::string& param_name, const Tensor& local) override;
  void finish_state_load() override;
  bool holds(const std::string& param_name) const override;
  void freeze_variance(int64_t after_step) override {
    for (Part& p : parts_) p.opt->freeze_variance(after_step);
  }

 private:
  std::vector<Part> parts_;
};

}  // namespace moetron::optim
