// How gradients are laid out in reduction buckets (before any memory is
// allocated). Two plans:
//
//   flat   parameters in reverse registration order (roughly backward's
//          order), packed back to back; rank r owns the r-th equal chunk of
//          each bucket, wherever it cuts a parameter (ZeRO-1 AdamW).
//   owner  (FlexMuon) every matrix the predicate selects belongs wholly to
//          one rank: each bucket's matrices are bin-packed onto the ranks
//          (largest Newton-Schulz cost first, to the rank with the least
//          total cost so far) and rank r's chunk holds exactly its matrices,
//          so a reduce-scatter delivers each owner the full reduced gradient
//          of its matrices and nothing else. Chunks are padded to the largest
//          one in the bucket (reduce-scatter needs equal chunks); the padding
//          is counted on the wire. Everything else goes into flat buckets.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "moetron/nn/parameter.h"
#include "moetron/nn/parameter_inventory.h"

namespace moetron::parallel {

struct BucketSlot {
  nn::Parameter* param = nullptr;
  int64_t offset = 0;  // in elements, inside the bucket
  int64_t numel = 0;
  int owner = -1;  // owner plan: the rank whose chunk holds the whole parameter
};

struct BucketSpec {
  std::vector<BucketSlot> slots;
  int64_t numel = 0;  // a multiple of the dp size
};

// The plans themselves, over parameter descriptions (nn/parameter_inventory.h):
// the one implementation the trainer (on its built model) and the memory
// model (on a predicted inventory) both use. Slots name parameters by their
// index in `params`.
struct PlannedSlot {
  size_t param = 0;  // index into the described parameters
  int64_t offset = 0, numel = 0;
  int owner = -1;
  bool operator==(const PlannedSlot&) const = default;
};
struct PlannedBucket {
  std::vector<PlannedSlot> slots;
  int64_t numel = 0;  // a multiple of the group size
  bool operator==(const PlannedBucket&) const = default;
};
using ParamFilter = std::function<bool(const nn::ParamInfo&)>;
std::vector<PlannedBucket> flat_bucket_plan(const std::vector<nn::ParamInfo>& params, int n,
                                            int64_t bucket_bytes, const ParamFilter& include = {});
std::vector<PlannedBucket> owner_bucket_plan(const std::vector<nn::ParamInfo>& params, int n,
                                             int64_t bucket_bytes, const ParamFilter& owned,
                                             const ParamFilter& include = {});
// A planned bucket list bound to the parameters it was planned over
// (`params` described as the plan's input).
std::vector<BucketSpec> bind_buckets(const std::vector<PlannedBucket>& plan,
                                     const nn::ParameterSet& params);

// include: the parameters this reducer carries (empty: all); expert
// parallelism reduces expert and dense gradients over different groups.
std::vector<BucketSpec> flat_bucket_plan(
    const nn::ParameterSet& params, int dp, int64_t bucket_bytes,
    const std::function<bool(const nn::Parameter&)>& include = {});

// Newton-Schulz cost of an [m, n] matrix, in multiply-adds per iteration:
// with s = min(m, n), l = max(m, n): X X^T (s^2 l), its square (s^3) and the
// product with X (s^2 l).
double newton_schulz_cost(int64_t m, int64_t n);

// The most elements of `ranges` ([offset, offset + numel) of a bucket cut
// into n chunks of `chunk`) any one chunk holds: the size a per-rank buffer
// of just those elements needs on every rank (ZeRO-1's AdamW second moment,
// which the Muon matrices of a chunk do not use).
int64_t max_chunk_share(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t chunk,
                        int64_t n);

// include: the parameters the plan covers (empty: all of them).
std::vector<BucketSpec> owner_bucket_plan(
    const nn::ParameterSet& params, int dp, int64_t bucket_bytes,
    const std::function<bool(const nn::Parameter&)>& owned,
    const std::function<bool(const nn::Parameter&)>& include = {});

}  // namespace moetron::parallel
