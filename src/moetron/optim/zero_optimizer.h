// ZeRO-1 distributed optimizer over the data-parallel group.
//
// The gradient reducer reduce-scatters each fp32 bucket, so rank r holds
// chunk r of every bucket (parallel/grad_reducer.h). This optimizer keeps the
// fp32 master weights and the moments of exactly those chunks (optimizer
// memory / dp), updates them, writes the new working copy of its chunk, and
// all-gathers the working copies so every rank has the whole model again.
//
// AdamW is elementwise, so a chunk that starts or ends inside a parameter is
// updated exactly as the one-rank optimizer would. Muon is not: each rank
// advances the momentum of its slice, the Nesterov update U is all-gathered
// per bucket, every rank that owns part of a matrix orthogonalises the whole
// U (Moonlight's distributed Muon, Algorithm 1) and applies its slice.
//
// Under tensor parallelism the dp group holds the same tp block of every
// sharded parameter, so the chunks cut blocks as they cut whole tensors. A
// tp-sharded Muon matrix is orthogonalised whole: its block's update is
// gathered over tp from the ranks updating the same block on the other tp
// ranks (the same dp rank there: the tp ranks' bucket plans are identical,
// which set_tensor_parallel checks), exactly like the one-rank optimizer
// under tp.
//
// FlexMuon: with the owner bucket plan (parallel/bucket_plan.h) every Muon
// matrix lies inside one rank's chunk, so its owner alone keeps its momentum
// and runs Newton-Schulz on it, with no update gathered; the all-gather of
// the working copies is all that is shared.
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/nn/tensor_parallel.h"
#include "moetron/optim/optimizer.h"
#include "moetron/parallel/grad_reducer.h"

namespace moetron::optim {

class ZeroOptimizer final : public ParamOptimizer {
 public:
  // reducer: in reduce_scatter mode, over the same dp communicator.
  // redundant_newton_schulz: every rank gathers every Muon update and
  // orthogonalises all of them (the literal baseline FlexMuon is measured
  // against), instead of only the matrices it holds part of.
  ZeroOptimizer(nn::ParameterSet& params, OptimizerOptions opts, parallel::GradReducer& reducer,
                bool redundant_newton_schulz = false);

  // Of this group's gradients only (collective over dp): under tp the caller
  // adds the other tp ranks' blocks (grad_squares).
  double grad_norm(kernels::Context& ctx, double grad_scale) override;
  // Squared L2 norms of the reduced gradients in the chunks, summed over dp
  // (collective): of the parameters every tp rank holds whole, and of this
  // rank's tp blocks (a block replicated over tp ranks counted by its
  // primary only), which the caller sums over tp.
  struct GradSquares {
    double replicated = 0, blocks = 0;
  };
  GradSquares grad_squares(kernels::Context& ctx);
  // For the optimizer of the dense parameters under tp (this dp group holds
  // one tp rank's blocks, and what every tp rank holds whole); not for one
  // whose group spans tp. Collective over tp->group: checks every tp rank
  // cut identical buckets.
  void set_tensor_parallel(const nn::TensorParallel* tp);
  bool holds(const nn::Parameter& p) const { return bucket_of_.count(&p) != 0; }
  StepInfo step(kernels::Context& ctx, int64_t step, double grad_scale, double known_norm) override;
  const OptimizerOptions& options() const override { return opts_; }
  void freeze_variance(int64_t after_step) override { opts_.variance_frozen_at = after_step; }
  std::vector<StateSlice> state_slices() override;
  bool sharded() const override { return true; }
  std::vector<StateSlice> checkpoint_masters() override;
  void load_master(const std::string& param_name, const Tensor& full) override;
  bool holds(const std::string& param_name) const override;

  // Overlap of the updated parameters' all-gather with the next forward:
  // step() starts one non-blocking all-gather per bucket (the buckets the
  // forward needs first, first) and returns; the forward calls
  // wait_for(p) before it reads p, which completes p's bucket (and
  // progresses the rest). Off: step() completes them all before returning.
  void set_overlap_param_gather(bool on) { overlap_gather_ = on; }
  void wait_for(const nn::Parameter& p);
  // Completes every gather still in flight (checkpoints, the next step).
  void finish_gathers();

 private:
  // The part of one parameter inside this rank's chunk of a bucket.
  struct Segment {
    nn::Parameter* param;
    int64_t param_lo, len;  // elements [param_lo, param_lo + len) of the flattened parameter
    int64_t chunk_lo;       // where they sit in the chunk
    bool muon, decay;
    int64_t v_lo = -1;  // AdamW: where its second moment sits in Shard::v
  };
  struct Shard {
    std::vector<Segment> segments;
    Tensor master;  // f32 [chunk]
    Tensor m;       // [chunk], optim.moment_dtype
    // AdamW's second moment of the chunk's AdamW segments only, packed (Muon
    // matrices keep one moment); sized for the rank holding the most, so
    // every rank allocates alike. Undefined when no chunk holds AdamW parameters.
    Tensor v;
    Tensor values_own;      // working-copy dtype [chunk]: all-gather source
    Tensor values_full;     // working-copy dtype [bucket numel]: all-gather destination
    Tensor u_own, u_full;   // f32 Muon update, only when the bucket holds a Muon matrix
    bool gather_u = false;  // some Muon matrix of the bucket is cut by a chunk boundary
  };
  void adamw_segment(kernels::Context& ctx, Shard& sh, const Tensor& grad, const Segment& sg,
                     double lr, double mult, int64_t step);
  std::vector<StateSlice> segment_slices(
      const std::function<void(const Shard&, const Segment&, std::vector<StateSlice>&, StateSlice)>&
          add);

  OptimizerOptions opts_;
  parallel::GradReducer& reducer_;
  const nn::TensorParallel* tp_ = nullptr;
  bool redundant_ = false;
  std::vector<Shard> shards_;
  bool overlap_gather_ = false;
  std::vector<std::unique_ptr<comm::Work>> gathers_;  // per bucket; null when complete
  std::unordered_map<const nn::Parameter*, size_t> bucket_of_;
  kernels::Context* gather_ctx_ = nullptr;  // the step's context, for the copies out of the gathers
  void finish_gather(size_t bucket);
};

}  // namespace moetron::optim
