// What Muon's update costs a step under a layout, two ways (issue 22's
// check of the seed's FlexMuon claim at scale):
//   replicated  every dp rank orthogonalises every matrix its stage holds
//               (Newton-Schulz on whole matrices, tp-sharded ones gathered
//               first), as ZeroOptimizer's redundant_newton_schulz does;
//   owner       FlexMuon: each matrix is orthogonalised once, by the dp rank
//               that owns it (largest first onto the least loaded), then
//               the working copies are all-gathered as ZeRO-1 does.
// Newton-Schulz on an a x b matrix (a <= b), each of `steps` iterations:
// X X^T (2 a^2 b), A A (2 a^3), B X (2 a^2 b) FLOPs, at the GEMM rate of a
// rows. The tp gather of a sharded matrix is left out of both (the same).
#pragma once

#include "moetron/planner/cost_model.h"

namespace moetron::planner {

struct MuonUpdate {
  double replicated_s = 0;     // every matrix on every dp rank
  double owner_compute_s = 0;  // the busiest owner's Newton-Schulz
  double owner_gather_s = 0;   // the working copies' all-gather
  int64_t matrices = 0;        // Muon matrices a stage holds
  double owner_s() const { return owner_compute_s + owner_gather_s; }
};

MuonUpdate muon_update_seconds(const CostModel& model, const LayoutChoice& layout, int steps = 5);

}  // namespace moetron::planner
