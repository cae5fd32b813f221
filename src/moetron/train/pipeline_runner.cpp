#include "moetron/train/pipeline_runner.h"

#include <algorithm>
#include <chrono>

#include "moetron/nn/tensor_parallel_2d.h"

namespace moetron::train {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
}  // namespace

PipelineRunner::PipelineRunner(nn::Transformer& model, comm::Communicator& pp_group,
                               parallel::ScheduleKind schedule, int64_t vpp)
    : model_(model), pp_(pp_group), schedule_(schedule), v_(vpp) {
  MOETRON_CHECK(model_.num_chunks() == v_, "pipeline rank holds ", model_.num_chunks(),
                " chunks, expected parallel.vpp = ", v_);
}

int64_t PipelineRunner::activation_rows(int64_t tokens) const {
  const nn::TensorParallel& tp = model_.tensor_parallel();
  return tp.sequence_parallel ? tp.slice_rows(tokens) : tokens;
}

nn::Transformer::ContextSlice PipelineRunner::share_of(const Tensor& ids,
                                                       const Tensor& targets) const {
  // A 2-D grid's row runs its rows of the micro-batch on every stage.
  const nn::TensorParallel& tp = model_.tensor_parallel();
  const Tensor row_ids = nn::grid_row_slice(tp, ids), row_targets = nn::grid_row_slice(tp, targets);
  // Under context parallelism every stage runs this rank's chunks of each row.
  if (model_.context_parallel().on()) return model_.context_slice(row_ids, row_targets);
  return {.ids = row_ids,
          .targets = row_targets,
          .positions = Tensor(),
          .batch = row_ids.dim(0),
          .seq = ids.dim(1)};
}

int PipelineRunner::tag(int64_t mb, int64_t stage, bool forward) const {
  return static_cast<int>((mb * stages() + stage) * 2 + (forward ? 0 : 1));
}

Tensor PipelineRunner::receive(int64_t rows, int peer, int t) {
  Tensor buf = Tensor::empty({rows, model_.config().d_model}, model_.precision().compute);
  const auto t0 = clock_type::now();
  pp_.recv(buf, peer, t);
  wait_s_ += since(t0);
  return buf;
}

void PipelineRunner::send(const Tensor& t, int peer, int tg) {
  // Sent buffers are held until delivered: drop the delivered ones first,
  // so 1F1B keeps O(pp) of them rather than the step's m.
  std::erase_if(sends_, [](auto& s) { return s.first->test(); });
  sends_.emplace_back(pp_.send_async(t, peer, tg), t);
}

void PipelineRunner::finish_sends() {
  const auto t0 = clock_type::now();
  for (auto& [work, buf] : sends_) work->wait();
  sends_.clear();
  wait_s_ += since(t0);
}

PipelineRunner::StepResult PipelineRunner::train_step(
    kernels::Context& ctx, const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
    double grad_scale, const std::vector<double>& loss_weights,
    const std::function<void()>& before_backward) {
  const auto m = static_cast<int64_t>(inputs.size());
  const int64_t pp = pp_.size(), me = pp_.rank(), last = stages() - 1;
  const std::vector<parallel::PipeOp> ops = parallel::pipeline_schedule(schedule_, pp, me, m, v_);
  std::vector<nn::Transformer::ContextSlice> local;
  for (int64_t i = 0; i < m; ++i)
    local.push_back(share_of(inputs[static_cast<size_t>(i)], targets[static_cast<size_t>(i)]));
  // The last backward of each chunk completes its gradients.
  std::vector<int64_t> backwards_left(static_cast<size_t>(v_), m);
  StepResult res;
  wait_s_ = 0;
  bool armed = false;
  for (const parallel::PipeOp& op : ops) {
    const auto mi = static_cast<size_t>(op.mb);
    const int64_t j = virtual_stage(op.chunk);
    const nn::Transformer::ContextSlice& mb = local[mi];
    const int64_t batch = mb.batch, seq = mb.seq, rows = activation_rows(batch * seq);
    const auto op_start = std::chrono::steady_clock::now();
    if (op.forward) {
      const Tensor in =
          j == 0 ? mb.ids : receive(rows, static_cast<int>((j - 1) % pp), tag(op.mb, j, true));
      nn::LossStats st;
      const nn::Transformer::ChunkStep at{
          .chunk = op.chunk,
          .mb = op.mb,
          .batch = batch,
          .seq = seq,
          .grad_scale = grad_scale,
          .loss_weight = loss_weights[mi],
          .backward = true,
          .ids = mb.ids,
          .positions = mb.positions,
          .multimodal = multimodal.empty() ? nullptr : multimodal[mi]};
      const Tensor out = model_.chunk_forward(ctx, at, in, mb.targets, st);
      res.stats.ce_sum += st.ce_sum;
      res.stats.tokens += st.tokens;
      res.stats.add_tasks(st);
      res.stats.dropped += st.dropped;
      res.stats.aux_loss += st.aux_loss * loss_weights[mi];  // weighted like their gradients
      res.stats.z_loss += st.z_loss * loss_weights[mi];
      if (j < last) send(out, static_cast<int>((j + 1) % pp), tag(op.mb, j + 1, true));
    } else {
      if (!armed && before_backward) before_backward();
      armed = true;
      const Tensor d_out =
          j == last ? Tensor()
                    : receive(rows, static_cast<int>((j + 1) % pp), tag(op.mb, j, false));
      const bool final_grads = --backwards_left[static_cast<size_t>(op.chunk)] == 0;
      const Tensor d_in = model_.chunk_backward(ctx, op.chunk, op.mb, d_out, final_grads);
      if (j > 0) send(d_in, static_cast<int>((j - 1) % pp), tag(op.mb, j - 1, false));
    }
    (op.forward ? res.forward_s : res.backward_s) += since(op_start);
  }
  finish_sends();
  res.wait_s = wait_s_;
  return res;
}

nn::LossStats PipelineRunner::forward_only(kernels::Context& ctx, const Tensor& inputs,
                                           const Tensor& targets) {
  const int64_t pp = pp_.size(), last = stages() - 1;
  const nn::Transformer::ContextSlice mb = share_of(inputs, targets);
  const int64_t batch = mb.batch, seq = mb.seq, rows = activation_rows(batch * seq);
  nn::LossStats stats;
  for (int64_t c = 0; c < v_; ++c) {
    const int64_t j = virtual_stage(c);
    const Tensor in =
        j == 0 ? mb.ids : receive(rows, static_cast<int>((j - 1) % pp), tag(0, j, true));
    const Tensor out =
        model_.chunk_forward(ctx,
                             {.chunk = c,
                              .mb = 0,
                              .batch = batch,
                              .seq = seq,
                              .ids = mb.ids,
                              .positions = mb.positions,
                              .multimodal = multimodal.empty() ? nullptr : multimodal.front()},
                             in, mb.targets, stats);
    if (j < last) send(out, static_cast<int>((j + 1) % pp), tag(0, j + 1, true));
  }
  finish_sends();
  return stats;
}

}  // namespace moetron::train
