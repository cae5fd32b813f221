#include "moetron/train/pipeline_schedule.h"

#include <algorithm>
#include <chrono>

#include "moetron/nn/flops.h"

namespace moetron::train {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }
}  // namespace

std::vector<PipeOp> pipeline_schedule(const std::string& kind, int64_t pp, int64_t rank, int64_t m, int64_t v) {
  MOETRON_CHECK(pp >= 1 && rank >= 0 && rank < pp && m >= 1 && v >= 1, "pipeline schedule of rank ", rank, " of ",
                pp, " for ", m, " micro-batches over ", v, " chunks");
  std::vector<PipeOp> ops;
  if (kind == "gpipe") {
    for (int64_t c = 0; c < v; ++c)
      for (int64_t mb = 0; mb < m; ++mb) ops.push_back({true, mb, c});
    for (int64_t c = v; c-- > 0;)
      for (int64_t mb = 0; mb < m; ++mb) ops.push_back({false, mb, c});
    return ops;
  }
  MOETRON_CHECK(kind == "1f1b", "parallel.schedule must be gpipe or 1f1b, got \"", kind, "\"");
  MOETRON_CHECK(m >= pp, "1F1B needs at least as many micro-batches as stages (", m, " < parallel.pp = ", pp, ")");
  MOETRON_CHECK(v == 1 || m % pp == 0, "interleaved 1F1B needs micro-batches (", m, ") divisible by parallel.pp = ",
                pp);
  const int64_t total = m * v;
  // k-th forward (backward) of this rank: chunk and micro-batch (Megatron's interleaving).
  const auto fwd = [&](int64_t k) { return PipeOp{true, (k / (pp * v)) * pp + k % pp, (k / pp) % v}; };
  const auto bwd = [&](int64_t k) { return PipeOp{false, (k / (pp * v)) * pp + k % pp, v - 1 - (k / pp) % v}; };
  const int64_t warmup = v == 1 ? std::min(pp - rank - 1, m) : std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(v == 1 ? PipeOp{true, k, 0} : fwd(k));
  for (int64_t i = 0; i < total - warmup; ++i) {
    ops.push_back(v == 1 ? PipeOp{true, warmup + i, 0} : fwd(warmup + i));
    ops.push_back(v == 1 ? PipeOp{false, i, 0} : bwd(i));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(v == 1 ? PipeOp{false, k, 0} : bwd(k));
  return ops;
}

double ideal_bubble_fraction(int64_t pp, int64_t m, int64_t v) {
  return static_cast<double>(pp - 1) / static_cast<double>(v * m + pp - 1);
}

std::vector<std::pair<int64_t, int64_t>> balanced_stages(const nn::ModelConfig& m, const nn::MoeConfig& e,
                                                         int64_t seq_len, int64_t pp) {
  const int64_t L = m.n_layers;
  MOETRON_CHECK(pp >= 1 && pp <= L, "parallel.pp = ", pp, " stages for model.n_layers = ", L,
                " (each stage needs a layer)");
  std::vector<double> prefix(static_cast<size_t>(L + 1), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    prefix[static_cast<size_t>(i + 1)] = prefix[static_cast<size_t>(i)] + nn::layer_flops_per_token(m, e, i, seq_len);
  }
  const double head = nn::head_flops_per_token(m);
  const auto cost = [&](int64_t a, int64_t b) { return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] + (b == L ? head : 0.0); };
  // best[s][i]: the smallest largest-stage cost of layers [0, i) in s + 1 stages.
  const double inf = 1e300;
  std::vector<std::vector<double>> best(static_cast<size_t>(pp), std::vector<double>(static_cast<size_t>(L + 1), inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(pp), std::vector<int64_t>(static_cast<size_t>(L + 1), 0));
  for (int64_t i = 1; i <= L; ++i) best[0][static_cast<size_t>(i)] = cost(0, i);
  for (int64_t s = 1; s < pp; ++s) {
    for (int64_t i = s + 1; i <= L; ++i) {
      for (int64_t j = s; j < i; ++j) {
        const double c = std::max(best[static_cast<size_t>(s - 1)][static_cast<size_t>(j)], cost(j, i));
        // Ties go to the later cut: earlier stages take more layers, leaving
        // the last (which also runs the loss) lighter.
        if (c <= best[static_cast<size_t>(s)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(i)] = c;
          cut[static_cast<size_t>(s)][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<std::pair<int64_t, int64_t>> stages(static_cast<size_t>(pp));
  int64_t end = L;
  for (int64_t s = pp - 1; s >= 0; --s) {
    const int64_t first = s == 0 ? 0 : cut[static_cast<size_t>(s)][static_cast<size_t>(end)];
    stages[static_cast<size_t>(s)] = {first, end};
    end = first;
  }
  return stages;
}

PipelineRunner::PipelineRunner(nn::Transformer& model, comm::Communicator& pp_group, std::string schedule,
                               int64_t vpp)
    : model_(model), pp_(pp_group), schedule_(std::move(schedule)), v_(vpp) {
  MOETRON_CHECK(model_.num_chunks() == v_, "pipeline rank holds ", model_.num_chunks(), " chunks, expected parallel.vpp = ",
                v_);
}

int64_t PipelineRunner::activation_rows(int64_t tokens) const {
  const nn::TensorParallel& tp = model_.tensor_parallel();
  return tp.sequence_parallel ? tp.slice_rows(tokens) : tokens;
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

PipelineRunner::StepResult PipelineRunner::train_step(kernels::Context& ctx, const std::vector<Tensor>& inputs,
                                                      const std::vector<Tensor>& targets, double grad_scale,
                                                      const std::vector<double>& loss_weights,
                                                      const std::function<void()>& before_backward) {
  const auto m = static_cast<int64_t>(inputs.size());
  const int64_t pp = pp_.size(), me = pp_.rank(), last = stages() - 1;
  const std::vector<PipeOp> ops = pipeline_schedule(schedule_, pp, me, m, v_);
  // The last backward of each chunk completes its gradients.
  std::vector<int64_t> backwards_left(static_cast<size_t>(v_), m);
  StepResult res;
  wait_s_ = 0;
  bool armed = false;
  for (const PipeOp& op : ops) {
    const auto mi = static_cast<size_t>(op.mb);
    const int64_t j = virtual_stage(op.chunk);
    const int64_t batch = inputs[mi].dim(0), seq = inputs[mi].dim(1), rows = activation_rows(batch * seq);
    if (op.forward) {
      const Tensor in = j == 0 ? inputs[mi] : receive(rows, static_cast<int>((j - 1) % pp), tag(op.mb, j, true));
      nn::LossStats st;
      const Tensor out = model_.chunk_forward(ctx, op.chunk, op.mb, in, targets[mi], batch, seq, grad_scale,
                                              loss_weights[mi], true, st);
      res.stats.ce_sum += st.ce_sum;
      res.stats.tokens += st.tokens;
      res.stats.dropped += st.dropped;
      res.stats.aux_loss += st.aux_loss * loss_weights[mi];  // weighted like their gradients
      res.stats.z_loss += st.z_loss * loss_weights[mi];
      if (j < last) send(out, static_cast<int>((j + 1) % pp), tag(op.mb, j + 1, true));
    } else {
      if (!armed && before_backward) before_backward();
      armed = true;
      const Tensor d_out = j == last ? Tensor() : receive(rows, static_cast<int>((j + 1) % pp), tag(op.mb, j, false));
      const bool final_grads = --backwards_left[static_cast<size_t>(op.chunk)] == 0;
      const Tensor d_in = model_.chunk_backward(ctx, op.chunk, op.mb, d_out, final_grads);
      if (j > 0) send(d_in, static_cast<int>((j - 1) % pp), tag(op.mb, j - 1, false));
    }
  }
  finish_sends();
  res.wait_s = wait_s_;
  return res;
}

nn::LossStats PipelineRunner::forward_only(kernels::Context& ctx, const Tensor& inputs, const Tensor& targets) {
  const int64_t pp = pp_.size(), last = stages() - 1;
  const int64_t batch = inputs.dim(0), seq = inputs.dim(1), rows = activation_rows(batch * seq);
  nn::LossStats stats;
  for (int64_t c = 0; c < v_; ++c) {
    const int64_t j = virtual_stage(c);
    const Tensor in = j == 0 ? inputs : receive(rows, static_cast<int>((j - 1) % pp), tag(0, j, true));
    const Tensor out = model_.chunk_forward(ctx, c, 0, in, targets, batch, seq, 0.0, 0.0, false, stats);
    if (j < last) send(out, static_cast<int>((j + 1) % pp), tag(0, j + 1, true));
  }
  finish_sends();
  return stats;
}

}  // namespace moetron::train
