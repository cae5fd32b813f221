// What one optimizer step did: the numbers the trainer logs and the
// monitor turns into metrics.
#pragma once

#include <cstdint>
#include <vector>

namespace moetron::train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;  // mean token cross-entropy of the step
  double aux_loss = 0, z_loss = 0;
  double lr = 0, grad_norm = 0;
  double tokens_per_s = 0, mfu = 0;
  double loss_scale = 1;
  int64_t tokens = 0;
  int64_t dropped = 0;  // (token, expert) slots dropped by the capacity factor, all MoE layers
  bool skipped = false;
  bool overflow = false;  // fp16: skipped for an overflow the loss scale absorbs
  // Data parallelism: seconds from the end of backward to the start of the
  // optimizer, blocked on gradient reductions (the exposed communication),
  // and the whole step's wall time.
  double comm_wait_s = 0, step_s = 0;
  double pipeline_wait_s = 0;  // pp > 1: blocked on stage-to-stage transfers (bubble + transfer)
  // Where the step's time went (seconds): reading the batch, the forward and
  // backward passes (pipeline transfers and waits included under pp),
  // clipping and the optimizer, and a checkpoint written after the step.
  double data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, checkpoint_s = 0;
  double snapshot_s = 0;  // the in-memory snapshot taken after the step
  // Seconds this rank was blocked waiting in any communication of the step
  // (gradient reductions, the token exchange, pipeline transfers, losses):
  // step_s - blocked_s is the time it was busy, which names stragglers.
  double blocked_s = 0;
  // Multimodal: each task's mean target cross-entropy this step (NaN for a
  // task with no targets) and the weight its loss had.
  std::vector<double> task_loss, task_weight;
};

// Seconds left at this step's pace for a run of total_steps. From the step's
// wall time, not its token rate: multimodal rows predict only their targets
// (a caption row ~15 of 96 positions), and rows x seq_len / tokens_per_s
// overstated a caption run's ETA 7x.
inline double eta_seconds(const StepRecord& r, int64_t total_steps) {
  return static_cast<double>(total_steps - r.step) * r.step_s;
}

}  // namespace moetron::train
