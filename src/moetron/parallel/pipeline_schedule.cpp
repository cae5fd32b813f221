#include "moetron/parallel/pipeline_schedule.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/nn/flops.h"

namespace moetron::parallel {

std::vector<PipeOp> pipeline_schedule(const std::string& kind, int64_t pp, int64_t rank, int64_t m,
                                      int64_t v) {
  return pipeline_schedule(parse_schedule(kind), pp, rank, m, v);
}

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "1f1b") return ScheduleKind::one_f_one_b;
  if (s == "gpipe") return ScheduleKind::gpipe;
  MOETRON_FAIL(
      "invalid config: 'parallel.schedule': must be 1f1b or gpipe (vpp > 1 with 1f1b is "
      "interleaved 1F1B), got \"",
      s, "\"");
}

const char* name_of(ScheduleKind k) {
  return k == ScheduleKind::gpipe ? "gpipe" : "1f1b";
}

std::vector<PipeOp> pipeline_schedule(ScheduleKind kind, int64_t pp, int64_t rank, int64_t m,
                                      int64_t v) {
  MOETRON_CHECK(pp >= 1 && rank >= 0 && rank < pp && m >= 1 && v >= 1, "pipeline schedule of rank ",
                rank, " of ", pp, " for ", m, " micro-batches over ", v, " chunks");
  std::vector<PipeOp> ops;
  if (kind == ScheduleKind::gpipe) {
    for (int64_t c = 0; c < v; ++c)
      for (int64_t mb = 0; mb < m; ++mb) ops.push_back({true, mb, c});
    for (int64_t c = v; c-- > 0;)
      for (int64_t mb = 0; mb < m; ++mb) ops.push_back({false, mb, c});
    return ops;
  }
  MOETRON_CHECK(m >= pp, "1F1B needs at least as many micro-batches as stages (", m,
                " < parallel.pp = ", pp, ")");
  MOETRON_CHECK(v == 1 || m % pp == 0, "interleaved 1F1B needs micro-batches (", m,
                ") divisible by parallel.pp = ", pp);
  const int64_t total = m * v;
  // k-th forward (backward) of this rank: chunk and micro-batch (Megatron's interleaving).
  const auto fwd = [&](int64_t k) {
    return PipeOp{true, (k / (pp * v)) * pp + k % pp, (k / pp) % v};
  };
  const auto bwd = [&](int64_t k) {
    return PipeOp{false, (k / (pp * v)) * pp + k % pp, v - 1 - (k / pp) % v};
  };
  const int64_t warmup =
      v == 1 ? std::min(pp - rank - 1, m) : std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(v == 1 ? PipeOp{true, k, 0} : fwd(k));
  for (int64_t i = 0; i < total - warmup; ++i) {
    ops.push_back(v == 1 ? PipeOp{true, warmup + i, 0} : fwd(warmup + i));
    ops.push_back(v == 1 ? PipeOp{false, i, 0} : bwd(i));
  }
  for (int64_t k = total - warmup; k < total; ++k)
    ops.push_back(v == 1 ? PipeOp{false, k, 0} : bwd(k));
  return ops;
}

double ideal_bubble_fraction(int64_t pp, int64_t m, int64_t v) {
  return static_cast<double>(pp - 1) / static_cast<double>(v * m + pp - 1);
}

StageCosts flop_stage_costs(const nn::ModelConfig& m, const nn::MoeConfig& e, int64_t seq_len) {
  StageCosts c;
  for (int64_t i = 0; i < m.n_layers; ++i)
    c.layers.push_back(nn::layer_flops_per_token(m, e, i, seq_len));
  c.head = nn::head_flops_per_token(m);
  return c;
}

std::vector<std::pair<int64_t, int64_t>> balanced_stages(const nn::ModelConfig& m,
                                                         const nn::MoeConfig& e, int64_t seq_len,
                                                         int64_t pp) {
  return balanced_stages(flop_stage_costs(m, e, seq_len), pp);
}

std::vector<std::pair<int64_t, int64_t>> balanced_stages(const StageCosts& costs, int64_t pp) {
  const auto L = static_cast<int64_t>(costs.layers.size());
  MOETRON_CHECK(pp >= 1 && pp <= L, "parallel.pp = ", pp, " stages for model.n_layers = ", L,
                " (each stage needs a layer)");
  std::vector<double> prefix(static_cast<size_t>(L + 1), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    prefix[static_cast<size_t>(i + 1)] =
        prefix[static_cast<size_t>(i)] + costs.layers[static_cast<size_t>(i)];
  }
  const auto cost = [&](int64_t a, int64_t b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] +
           (a == 0 ? costs.embedding : 0.0) + (b == L ? costs.head : 0.0);
  };
  // best[s][i]: the smallest largest-stage cost of layers [0, i) in s + 1 stages.
  const double inf = 1e300;
  std::vector<std::vector<double>> best(static_cast<size_t>(pp),
                                        std::vector<double>(static_cast<size_t>(L + 1), inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(pp),
                                        std::vector<int64_t>(static_cast<size_t>(L + 1), 0));
  for (int64_t i = 1; i <= L; ++i) best[0][static_cast<size_t>(i)] = cost(0, i);
  for (int64_t s = 1; s < pp; ++s) {
    for (int64_t i = s + 1; i <= L; ++i) {
      for (int64_t j = s; j < i; ++j) {
        const double c =
            std::max(best[static_cast<size_t>(s - 1)][static_cast<size_t>(j)], cost(j, i));
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

std::vector<std::pair<int64_t, int64_t>> stage_chunks(const nn::ModelConfig& m,
                                                      const nn::MoeConfig& e, int64_t seq_len,
                                                      int64_t pp, int64_t vpp, int64_t rank) {
  MOETRON_CHECK(pp >= 1 && vpp >= 1 && rank >= 0 && rank < pp, "pipeline rank ", rank,
                " of parallel.pp = ", pp, " with parallel.vpp = ", vpp);
  if (vpp == 1) return {balanced_stages(m, e, seq_len, pp)[static_cast<size_t>(rank)]};
  MOETRON_CHECK(m.n_layers % (pp * vpp) == 0, "model.n_layers = ", m.n_layers,
                " must divide into parallel.pp * parallel.vpp = ", pp * vpp, " equal chunks");
  const int64_t per = m.n_layers / (pp * vpp);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t c = 0; c < vpp; ++c) {
    const int64_t j = c * pp + rank;
    chunks.emplace_back(j * per, (j + 1) * per);
  }
  return chunks;
}

std::vector<std::vector<TimedOp>> simulate_schedule_timeline(ScheduleKind kind, int64_t pp,
                                                             int64_t microbatches, int64_t v,
                                                             double forward, double backward,
                                                             double hop) {
  const int64_t stages = pp * v;
  std::vector<std::vector<PipeOp>> ops;
  for (int64_t r = 0; r < pp; ++r) ops.push_back(pipeline_schedule(kind, pp, r, microbatches, v));
  std::vector<std::vector<TimedOp>> timeline(static_cast<size_t>(pp));
  std::vector<double> clock(static_cast<size_t>(pp), 0.0);
  // Finish times by (backward, virtual stage, micro-batch).
  std::vector<double> done(static_cast<size_t>(2 * stages * microbatches), -1.0);
  auto at = [&](bool fwd, int64_t j, int64_t mb) -> double& {
    return done[static_cast<size_t>(((fwd ? 0 : 1) * stages + j) * microbatches + mb)];
  };
  const double f = forward / static_cast<double>(v), b = backward / static_cast<double>(v);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      std::vector<TimedOp>& mine = timeline[static_cast<size_t>(r)];
      // Run this rank's ops until one waits on another rank.
      while (mine.size() < ops[static_cast<size_t>(r)].size()) {
        const PipeOp& op = ops[static_cast<size_t>(r)][mine.size()];
        const int64_t j = op.chunk * pp + r;
        double ready = 0;
        if (op.forward && j > 0) {
          ready = at(true, j - 1, op.mb);
          if (ready < 0) break;
          ready += hop;
        } else if (!op.forward) {
          ready = j == stages - 1 ? at(true, j, op.mb) : at(false, j + 1, op.mb);
          if (ready < 0) break;
          if (j != stages - 1) ready += hop;
        }
        double& c = clock[static_cast<size_t>(r)];
        const double begin = std::max(c, ready);
        c = begin + (op.forward ? f : b);
        at(op.forward, j, op.mb) = c;
        mine.push_back({op, begin, c});
        progress = true;
      }
    }
  }
  for (int64_t r = 0; r < pp; ++r) {
    MOETRON_CHECK(timeline[static_cast<size_t>(r)].size() == ops[static_cast<size_t>(r)].size(),
                  "pipeline schedule ", name_of(kind), " deadlocks at pp ", pp, ", ", microbatches,
                  " micro-batches, vpp ", v, " (rank ", r, ")");
  }
  return timeline;
}

double simulate_schedule(ScheduleKind kind, int64_t pp, int64_t microbatches, int64_t v,
                         double forward, double backward, double hop) {
  double end = 0;
  for (const auto& rank :
       simulate_schedule_timeline(kind, pp, microbatches, v, forward, backward, hop)) {
    if (!rank.empty()) end = std::max(end, rank.back().end);
  }
  return end;
}

}  // namespace moetron::parallel
