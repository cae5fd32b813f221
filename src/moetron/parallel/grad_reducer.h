// Data-parallel gradient reduction in buckets, overlapped with backward.
//
// Parameters are packed into fp32 buckets by a plan (parallel/bucket_plan.h;
// by default flat, in reverse registration order, roughly the order backward
// finishes them: head and last block first, embedding last). During the last micro-batch's
// backward, every gradient the model reports ready is copied into its bucket
// (a bf16 gradient, train.grad_dtype, widened exactly; an all-reduced sum is
// rounded back into it);
// the moment a bucket's last gradient arrives its reduction starts
// (non-blocking), so communication runs under the rest of backward. finish()
// waits for all of them. Each bucket is padded to a multiple of the dp size
// so it reduce-scatters into equal per-rank chunks.
//
// Reduction is a SUM: the model's gradients are already scaled by
// 1 / (tokens of the global batch), so the sum over ranks is the global
// batch's gradient. Modes:
//   allreduce       every rank gets the whole reduced bucket (copied back
//                   into the parameters' gradients);
//   reduce_scatter  rank r gets chunk r of each bucket only (ZeRO-1: the
//                   distributed optimizer updates that chunk).
//
// Compression (parallel/grad_compressor.h), after `warmup_steps` uncompressed
// steps, with error feedback: each rank adds its residual to the bucket,
// encodes chunk j for rank j, keeps what the encoding lost as the new
// residual, and exchanges the encodings with one all-to-all; rank r decodes
// and sums the dp encodings of its chunk in fp32. That is the reduce-scatter
// (every value quantised once, by its sender). In allreduce mode the summed
// chunk is encoded once more (with the owner's own residual) and
// all-gathered, as ZeRO++'s qgZ does. Bytes on the wire are what the
// communicator counts.
//
// Preconditioned compression (parallel.compression_space = "preconditioned",
// grad_reducer_precondition.cpp): every rank encodes its gradient divided by
// a scale d, and the reduced sum is multiplied by d after decoding. For
// AdamW's parameters d is the denominator of its update, sqrt(v / (1 -
// beta2^t)) + eps, so what is encoded is the update itself: a block's
// sign-and-mean error moves each coordinate by at most the block's mean
// update, where in gradient space a coordinate with a small v would take its
// block's mean gradient divided by its own small sqrt(v). Parameters without
// a second moment (Muon's matrices) get one d per tensor, the RMS of their
// last uncompressed reduced gradient, so every tensor enters the encoding
// (and sparse_sign's choice of blocks) at unit scale. The residuals stay in
// the gradient's units, so when d follows a live v from step to step what
// is owed is still the same gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "moetron/comm/communicator.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/parameter.h"
#include "moetron/parallel/bucket_plan.h"
#include "moetron/parallel/grad_compressor.h"

namespace moetron::parallel {

enum class ReduceMode { allreduce, reduce_scatter };

struct ReducerOptions {
  int64_t bucket_bytes = 16 << 20;  // fp32 gradient bytes per bucket (at least one parameter)
  bool overlap = true;              // false: start every reduction after backward
  ReduceMode mode = ReduceMode::allreduce;
  CompressOptions compress;  // kind none: fp32 reductions
  int64_t warmup_steps = 0;  // first steps reduced uncompressed
  // Compression starts only at the step given to compress_from() (the
  // trainer's automatic start, train/compression_start.h), not after warmup_steps.
  bool start_on_request = false;
  // The trainer builds a preconditioner when compression starts
  // (parallel.compression_space = "preconditioned"): one more f32 per bucket
  // element, which the memory model counts.
  bool preconditioned = false;
};

struct Bucket {
  std::vector<BucketSlot> slots;
  int64_t numel = 0;  // padded to a multiple of the dp size
  int64_t chunk = 0;  // numel / dp: the part rank r owns is [r * chunk, (r + 1) * chunk)
  Tensor flat;        // f32 [numel], tag comm
  Tensor shard;       // f32 [chunk]: the reduced chunk (reduce_scatter mode)
  // Compression: error-feedback residuals (this rank's), encoded buffers.
  Tensor residual;      // f32 [numel]: what this rank's encodings lost so far
  Tensor residual2;     // f32 [chunk]: the second hop's (allreduce mode)
  Tensor send, recv;    // u8 [dp * encoded(chunk)]
  Tensor send2, recv2;  // u8 [encoded(chunk)], [dp * encoded(chunk)] (allreduce mode)
  // Preconditioned compression: d per element (1 in the padding), and per
  // slot the one d of a tensor without a second moment (0: d per element).
  Tensor scale;  // f32 [numel], undefined until begin_preconditioner()
  std::vector<float> slot_scale;
};

class GradReducer {
 public:
  // carries: the parameters this reducer reduces (empty: all; expert
  // parallelism reduces dense and expert gradients over different groups);
  // the plan must hold exactly those. plan: empty for
  // flat_bucket_plan(params, dp.size(), opts.bucket_bytes, carries).
  GradReducer(nn::ParameterSet& params, comm::Communicator& dp, ReducerOptions opts,
              std::vector<BucketSpec> plan = {},
              const std::function<bool(const nn::Parameter&)>& carries = {});

  // Arms the reducer for the backward that completes the step's gradients
  // (the last micro-batch). Earlier micro-batches only accumulate.
  // `step` (1-based) decides whether this step is compressed.
  void arm(int64_t step = 0) {
    armed_ = true;
    residual_sq_ = 0;
    compress_now_ = opts_.compress.kind != CompressKind::none && step >= compress_from_;
  }
  // Compression from step `step` on (1-based).
  void compress_from(int64_t step) { compress_from_ = step; }
  int64_t compressing_from() const { return compress_from_; }
  // The model's grad-ready callback.
  void grad_ready(kernels::Context& ctx, nn::Parameter& p);
  // Starts what has not started, waits for every bucket, and (allreduce mode)
  // writes the reduced sums back into the parameters' gradients.
  void finish(kernels::Context& ctx);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ReducerOptions& options() const { return opts_; }
  comm::Communicator& comm() { return dp_; }
  // Gradient elements reduced per step (unpadded) and with padding.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const;
  // Seconds finish() spent blocked on reductions in the last step: the
  // communication backward did not hide.
  double last_wait_seconds() const { return wait_seconds_; }
  // RMS of this rank's error-feedback residual (first hop, in the
  // gradient's units) after the last compressed step; 0 when it was not compressed.
  // Bounded when the encoding keeps up; growing step after step, it is
  // error that never gets sent (parallel.compression_space explains one cause).
  double last_residual_rms() const {
    return std::sqrt(residual_sq_ / static_cast<double>(std::max<int64_t>(1, padded_numel())));
  }
  // The error-feedback residuals cut by parameter (views of the live state,
  // for checkpoints that reshard over dp); empty without compression. The
  // first hop covers every parameter whole; the second (allreduce mode) only
  // what lies in this rank's chunk. Padding is not carried.
  struct ResidualPiece {
    const nn::Parameter* param = nullptr;
    bool second_hop = false;
    int64_t offset = 0;  // the parameter's first element it holds
    Tensor values;       // f32, 1-D
  };
  std::vector<ResidualPiece> residual_pieces();

  // Preconditioned compression, built once when compression starts (and
  // again on resume, from the same frozen state): begin, then the AdamW
  // denominators this rank holds, then finish (collective over dp).
  // clamp > 0: each rank sends its g / d (plus residual) clamped to
  // [-clamp, clamp], the rest kept in its residual: one coordinate whose d
  // is stale (its v decayed while it had no gradient) is then spread over
  // later steps instead of over its whole block at once.
  void begin_preconditioner(float clamp = 0);
  // Elements [offset, offset + d.numel()) of the parameter `param_name`
  // (flattened, this rank's tp block) are divided by d (f32, > 0).
  // False when this reducer does not carry that parameter.
  bool set_denominator(const std::string& param_name, int64_t offset, const Tensor& d);
  // Completes every bucket's d over dp (a max: each element set by the ranks
  // that hold its state). A parameter with no d set gets one per tensor:
  // `saved[name]` when given (a resume), else the RMS of its last reduced
  // gradient (1 when that is 0). collective = false: every rank set every
  // d it needs (a replicated optimizer) and `saved` holds each per-tensor
  // scale, so no rank communicates (a refresh at every step).
  void finish_preconditioner(const std::unordered_map<std::string, float>& saved = {},
                             bool collective = true);
  // Raises each per-element d below `share` x its tensor's mean d to that
  // floor (after finish_preconditioner; every rank the same). A coordinate
  // whose frozen v is near zero (a token unseen for a while) would turn its
  // next gradient into an update of g / sqrt(v), and the encoding would
  // spread that over its block.
  void floor_denominators(double share);
  // Copies d of elements [offset, offset + out.numel()) of `param_name` into
  // out (f32); false when this reducer does not carry it.
  bool get_denominator(const std::string& param_name, int64_t offset, const Tensor& out) const;
  bool preconditioned() const { return !buckets_.empty() && buckets_.front().scale.defined(); }
  // The per-tensor scales finish_preconditioner chose, by parameter name (for trainer.json).
  std::unordered_map<std::string, float> tensor_scales() const;

 private:
  void start(size_t bucket);
  void finish_compressed(Bucket& b);
  // The chunk of the reduced sum this rank holds (reduce_scatter: the shard;
  // allreduce: its part of the flat buffer), for per-tensor RMS.
  const float* own_reduced_chunk(const Bucket& b) const;
  // Per slot, the sum of squares of its last reduced gradient (collective).
  Tensor reduced_sums_of_squares(const Bucket& b);

  comm::Communicator& dp_;
  ReducerOptions opts_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const nn::Parameter*, std::pair<size_t, size_t>> where_;  // bucket, slot
  std::vector<int64_t> pending_;  // gradients still missing per bucket
  std::vector<std::unique_ptr<comm::Work>> work_;
  bool armed_ = false;
  bool compress_now_ = false;
  int64_t compress_from_;  // first compressed step
  int64_t numel_ = 0;
  double wait_seconds_ = 0;
  double residual_sq_ = 0;  // sum of squares of the residuals the last step left
  float precondition_clamp_ = 0;
};

}  // namespace moetron::parallel
