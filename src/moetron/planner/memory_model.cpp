#include "moetron/planner/memory_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/kernels/quantized_state.h"
#include "moetron/parallel/bucket_plan.h"
#include "moetron/parallel/pipeline_schedule.h"
#include "moetron/parallel/training_plan.h"
#include "moetron/planner/gemm_scratch.h"
#include "moetron/planner/memory_replay.h"

namespace moetron::planner {

namespace {

// Parameters, gradients, optimizer state and the reducers' buckets come
// from the TrainingPlan the trainer runs (parallel/training_plan.h): its
// parameter inventory is what nn::Transformer registers on the rank, its
// bucket plans are the reducers'.

using nn::ParamInfo;
using parallel::PlannedBucket;

parallel::PlanSettings plan_settings(const MemoryInputs& in) {
  const Layout& lay = in.layout;
  parallel::PlanSettings s;
  s.model = in.model;
  s.moe = in.moe;
  s.media = in.media;
  s.precision = in.precision;
  s.tp = lay.tp;
  s.ep = lay.ep;
  s.pp = lay.pp;
  s.vpp = lay.vpp;
  s.cp = lay.cp;
  s.tp_rows = lay.tp_rows;
  s.sequence_parallel = lay.tp > 1 && (lay.sequence_parallel || lay.tp_rows > 1);
  s.zero = lay.zero1;
  s.schedule = parallel::parse_schedule(lay.schedule);
  s.micro_batch = in.micro_batch;
  s.seq_len = in.seq_len;
  s.grad_accum = in.grad_accum;
  s.optimizer = parallel::parse_optimizer(in.optimizer);
  s.muon_distribution = parallel::parse_muon_distribution(in.muon_distribution);
  s.adamw_patterns = in.adamw_patterns;
  s.moment_dtype = in.moment_dtype;
  s.master_dtype = in.master_dtype;
  s.factored_second_moment = in.factored_second_moment;
  s.reducer.bucket_bytes = in.reducer.bucket_bytes;
  s.reducer.compress = in.reducer.compress;
  s.reducer.preconditioned = in.reducer.preconditioned;
  return s;
}

// A GradReducer's buffers over a group of n ranks; `sends` collects the
// buckets an uncompressed all-reduce copies into a send buffer.
void reducer_buffers(Replay& r, std::vector<Buf>& fixed, const parallel::ReducerPlan& plan,
                     std::vector<int64_t>& sends) {
  const int64_t n = plan.size;
  const bool reduce_scatter = plan.options.mode == parallel::ReduceMode::reduce_scatter;
  const parallel::CompressOptions& co = plan.options.compress;
  for (const PlannedBucket& b : plan.buckets) {
    const int64_t chunk = b.numel / n;
    fixed.push_back(r.alloc(b.numel, DType::f32, MemTag::comm));
    if (reduce_scatter) fixed.push_back(r.alloc(chunk, DType::f32, MemTag::comm));
    if (co.kind == parallel::CompressKind::none) {
      if (!reduce_scatter) sends.push_back(b.numel);
      continue;
    }
    const int64_t enc = parallel::encoded_bytes(co, chunk);
    fixed.push_back(r.alloc(b.numel, DType::f32, MemTag::optimizer));
    if (plan.options.preconditioned)
      fixed.push_back(r.alloc(b.numel, DType::f32, MemTag::optimizer));
    fixed.push_back(r.alloc(n * enc, DType::u8, MemTag::comm));
    fixed.push_back(r.alloc(n * enc, DType::u8, MemTag::comm));
    if (!reduce_scatter) {
      fixed.push_back(r.alloc(chunk, DType::f32, MemTag::optimizer));
      fixed.push_back(r.alloc(enc, DType::u8, MemTag::comm));
      fixed.push_back(r.alloc(n * enc, DType::u8, MemTag::comm));
    }
  }
}

// The one-rank optimizer's slots for the parameters it updates: an fp32
// master where the working copy is not fp32 (none for a bf16 copy under
// optim.master_dtype = bf16: it is its own master), the first moment
// (Muon's momentum), the second for AdamW.
void optimizer_state(Replay& r, std::vector<Buf>& fixed, const MemoryInputs& in,
                     const parallel::TrainingPlan& plan, const ParamInfo& p) {
  const DType master = in.precision.accum;
  const bool own_master = p.value == DType::bf16 && in.master_dtype == DType::bf16;
  if (p.value != master && !own_master)
    fixed.push_back(r.alloc(p.numel(), master, MemTag::optimizer));
  const DType mom = in.moment_dtype == DType::f32 ? master : in.moment_dtype;
  // One moment of the parameter: in `mom`, or 8-bit codes then an fp32
  // scale per kernels::kStateBlock values.
  const auto moment = [&] {
    fixed.push_back(r.alloc(p.numel(), mom, MemTag::optimizer));
    if (mom == DType::u8)
      fixed.push_back(
          r.alloc(kernels::state_scale_count(p.numel()), DType::f32, MemTag::optimizer));
  };
  moment();
  if (plan.uses_muon(p)) return;
  if (mom == DType::u8 && in.factored_second_moment && p.shape.rank() == 2) {
    fixed.push_back(r.alloc(p.rows(), DType::f32, MemTag::optimizer));  // row and column averages
    fixed.push_back(r.alloc(p.cols(), DType::f32, MemTag::optimizer));
  } else {
    moment();
  }
}

// ZeroOptimizer over a reducer's buckets: fp32 master and m of this rank's
// chunk, v of its AdamW elements; the working copies' all-gather buffers; Muon's update
// all-gather where a matrix straddles a chunk boundary (every matrix when
// the orthogonalisation is replicated).
void zero_state(Replay& r, std::vector<Buf>& fixed, const MemoryInputs& in,
                const parallel::TrainingPlan& plan, const std::vector<ParamInfo>& params,
                const parallel::ReducerPlan& reducer) {
  const DType mom = in.moment_dtype;
  const int64_t n = reducer.size;
  for (const PlannedBucket& b : reducer.buckets) {
    const int64_t chunk = b.numel / n;
    fixed.push_back(r.alloc(chunk, DType::f32, MemTag::optimizer));
    fixed.push_back(r.alloc(chunk, mom, MemTag::optimizer));
    // AdamW's second moment: only the AdamW elements, as much as the fullest chunk holds.
    std::vector<std::pair<int64_t, int64_t>> adamw;
    for (const parallel::PlannedSlot& sl : b.slots) {
      if (!plan.uses_muon(params[sl.param])) adamw.emplace_back(sl.offset, sl.numel);
    }
    const int64_t v_len = parallel::max_chunk_share(adamw, chunk, n);
    if (v_len > 0) fixed.push_back(r.alloc(v_len, mom, MemTag::optimizer));
    DType value = b.slots.empty() ? DType::f32 : params[b.slots.back().param].value;
    bool muon = false, gather_u = false;
    for (const parallel::PlannedSlot& sl : b.slots) {
      const ParamInfo& p = params[sl.param];
      if (p.value != value) value = DType::f32;
      if (plan.uses_muon(p)) {
        muon = true;
        if (sl.offset / chunk != (sl.offset + sl.numel - 1) / chunk ||
            plan.settings().muon_distribution == parallel::MuonDistribution::replicated) {
          gather_u = true;
        }
      }
    }
    fixed.push_back(r.alloc(chunk, value, MemTag::comm));
    fixed.push_back(r.alloc(b.numel, value, MemTag::comm));
    if (muon) fixed.push_back(r.alloc(chunk, DType::f32, MemTag::comm));
    if (gather_u) fixed.push_back(r.alloc(b.numel, DType::f32, MemTag::comm));
  }
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The shapes the activation replay works with, for this rank's shard.
Dims dims_of(const MemoryInputs& in) {
  const Layout& lay = in.layout;
  const nn::ModelConfig& m = in.model;
  const nn::MoeConfig& e = in.moe;
  // A 2-D grid's row (nn/tensor_parallel_2d.h) is 1-D sequence-parallel tp
  // over its C ranks on its 1/R of the micro-batch's rows.
  const int64_t rows = std::max<int64_t>(lay.tp_rows, 1), tp = lay.tp / rows;
  const bool sp = tp > 1 && (lay.sequence_parallel || rows > 1);
  // Under context parallelism every module but attention sees this rank's
  // two chunks of each sequence as its sequence.
  const int64_t s_local = in.seq_len / lay.cp;
  const int64_t t = in.micro_batch / rows * s_local;
  Dims x;
  x.b = in.micro_batch / rows;
  x.s = s_local;
  x.t = t;
  x.cp = lay.cp;
  x.cp_rank = (lay.stage_rank / lay.tp) % lay.cp;
  x.cp_seq = in.seq_len;
  x.cp_all_to_all = lay.cp > 1 && in.cp_all_to_all;
  x.tp = tp;
  x.grid_rows = rows;
  x.ep = lay.ep;
  x.sp = sp;
  x.tb = sp ? t / tp : t;
  x.tm = tp > 1 ? t / tp : t;
  x.d = m.d_model;
  x.h = m.n_heads / tp;
  x.hkv = tp > m.n_kv_heads ? 1 : m.n_kv_heads / tp;
  x.hd = m.resolved_head_dim();
  x.ffn = m.ffn_hidden / tp;
  x.v = m.vocab_size / tp;
  x.e = std::max<int64_t>(e.num_experts, 1);
  x.k = e.top_k;
  x.f = e.expert_hidden;
  x.shared_hidden =
      (e.shared_expert_hidden > 0 ? e.shared_expert_hidden : e.expert_hidden) * e.shared_experts;
  x.rows_local = x.tm * e.top_k;
  if (e.capacity_factor > 0) {
    // Capacity per expert over the ep group's tokens (moe_dispatch.cpp);
    // balanced routing gives each rank its share of the kept slots.
    const auto cap = static_cast<int64_t>(std::ceil(static_cast<double>(lay.ep * x.tm * e.top_k) *
                                                    e.capacity_factor / static_cast<double>(x.e)));
    x.rows_local = std::min(x.rows_local, ceil_div(cap * x.e, lay.ep));
  }
  x.rows_expert = x.rows_local;
  x.threads = std::max<int64_t>(in.threads, 1);
  x.c = in.precision.compute;
  x.a = in.precision.accum;
  x.aux = e.aux_loss_coef > 0;
  x.z = e.z_loss_coef > 0;
  return x;
}

// Muon's update of its largest matrix: u, o, the iterate and its update,
// two Gram matrices; a tp-sharded matrix is gathered and orthogonalised whole.
void muon_workspace(Replay& r, const MemoryInputs& in, const parallel::TrainingPlan& plan,
                    const std::vector<ParamInfo>& params) {
  int64_t shard = 0, whole = 0;
  for (const ParamInfo& p : params) {
    if (!plan.uses_muon(p)) continue;
    if (p.numel() * (p.sharded() ? in.layout.tp : 1) > whole) {
      whole = p.numel() * (p.sharded() ? in.layout.tp : 1);
      shard = p.sharded() ? p.numel() : 0;
    }
  }
  std::vector<Buf> ws;
  const DType md = in.precision.accum;
  if (shard > 0) {
    ws.push_back(r.ws(shard, md));
    ws.push_back(r.ws(shard, md));
    ws.push_back(r.alloc(whole, md, MemTag::comm));
    ws.push_back(r.alloc(whole, md, MemTag::comm));
  }
  if (whole > 0) {
    const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(whole)));
    for (int i = 0; i < (shard > 0 ? 3 : 4); ++i) ws.push_back(r.ws(whole, md));
    for (int i = 0; i < 2; ++i) ws.push_back(r.ws(side * side, md));
  }
}

// Uncompressed all-reduces copy each bucket into a send buffer held until
// the reduction completes (comm/mpi_communicator.cpp): at the end of
// backward every bucket's copy is in flight. `grid_part` (elements, `dt`):
// the 2-D grid embedding gradient's reduce-scattered sum, allocated with
// every bucket in flight but the dense reducer's last one, which the
// embedding completes.
void end_of_step_sends(Replay& r, const std::vector<parallel::ReducerPlan>& reducers,
                       const std::vector<int64_t>& allreduce_sends, int64_t grid_part, DType dt) {
  const bool dense_last = !reducers.empty() &&
                          reducers.back().carries == parallel::GradGroup::dense &&
                          reducers.back().options.mode != parallel::ReduceMode::reduce_scatter &&
                          !reducers.back().buckets.empty() && !allreduce_sends.empty();
  const size_t before = allreduce_sends.size() - (grid_part > 0 && dense_last ? 1 : 0);
  std::vector<Buf> sends;
  for (size_t i = 0; i < before; ++i)
    sends.push_back(r.alloc(allreduce_sends[i], DType::f32, MemTag::comm));
  if (grid_part > 0) Buf part = r.alloc(grid_part, dt, MemTag::comm);
  for (size_t i = before; i < allreduce_sends.size(); ++i)
    sends.push_back(r.alloc(allreduce_sends[i], DType::f32, MemTag::comm));
}

}  // namespace

MemoryEstimate estimate_memory(const MemoryInputs& in) {
  const Layout& lay = in.layout;
  MOETRON_CHECK(lay.dp >= 1 && lay.tp >= 1 && lay.pp >= 1 && lay.ep >= 1 && lay.vpp >= 1,
                "memory model: every parallel degree must be >= 1");
  MOETRON_CHECK(lay.cp >= 1, "memory model: parallel.cp must be >= 1");
  MOETRON_CHECK(lay.stage >= 0 && lay.stage < lay.pp, "memory model: stage ", lay.stage,
                " of parallel.pp = ", lay.pp);
  const int64_t stage_size = lay.dp * lay.cp * lay.tp;
  MOETRON_CHECK(lay.stage_rank >= 0 && lay.stage_rank < stage_size, "memory model: rank ",
                lay.stage_rank, " of a stage of ", stage_size);
  MOETRON_CHECK(in.micro_batch >= 1 && in.seq_len >= 1 && in.grad_accum >= 1,
                "memory model: micro_batch, seq_len and grad_accum must be positive");
  MOETRON_CHECK(in.seq_len % (2 * lay.cp) == 0, "memory model: train.seq_len = ", in.seq_len,
                " does not split into 2 * parallel.cp = ", 2 * lay.cp, " chunks");
  const int64_t t = in.micro_batch * in.seq_len;  // the whole micro-batch's
  MOETRON_CHECK(
      lay.tp_rows <= 1 || (lay.tp % lay.tp_rows == 0 && in.micro_batch % lay.tp_rows == 0),
      "memory model: a 2-D grid of ", lay.tp_rows, " rows over tp = ", lay.tp,
      " needs a micro-batch its rows divide");
  MOETRON_CHECK(lay.tp == 1 || t / lay.cp % lay.tp == 0, "memory model: the ", t / lay.cp,
                " tokens of a micro-batch on a cp rank must divide over parallel.tp = ", lay.tp);
  const parallel::TrainingPlan plan(
      plan_settings(in), static_cast<int>(stage_size * lay.pp),
      lay.vpp == 1 && lay.pp > 1 ? lay.stages : std::vector<parallel::LayerRange>{});
  const parallel::RankPlan rank =
      plan.rank_plan(static_cast<int>(lay.stage * plan.stage_size() + lay.stage_rank));
  const std::vector<std::pair<int64_t, int64_t>> chunks = plan.chunks(lay.stage);
  const bool first = rank.place.embedding, last = rank.place.head;
  const nn::ParamInventory& inv = rank.inventory;
  Replay r;
  MemoryEstimate est;
  std::vector<Buf> fixed;
  for (const auto& [n, dt] : inv.value_buffers) fixed.push_back(r.alloc(n, dt, MemTag::params));
  for (const auto& [n, dt] : inv.grad_buffers) fixed.push_back(r.alloc(n, dt, MemTag::grads));
  for (const ParamInfo& p : inv.params) est.param_count += p.numel();

  // The reducers the plan gives this rank (the trainer builds the same).
  std::vector<int64_t> allreduce_sends;
  for (const parallel::ReducerPlan& red : rank.reducers)
    reducer_buffers(r, fixed, red, allreduce_sends);
  // Optimizer state: ZeRO-1 holds the dense state in dp chunks and the
  // tp-partial state in chunks over the stage, and updates routed experts
  // (under ep) whole; otherwise every parameter has its slots.
  if (lay.zero1) {
    for (const parallel::ReducerPlan& red : rank.reducers) {
      if (red.carries != parallel::GradGroup::expert)
        zero_state(r, fixed, in, plan, inv.params, red);
    }
    for (const ParamInfo& p : inv.params) {
      if (plan.grad_group(p) == parallel::GradGroup::expert) optimizer_state(r, fixed, in, plan, p);
    }
  } else {
    for (const ParamInfo& p : inv.params) optimizer_state(r, fixed, in, plan, p);
  }
  // The step's batch buffers (inputs and targets of every micro-batch).
  for (int64_t mb = 0; mb < in.grad_accum; ++mb) {
    fixed.push_back(r.alloc(t, DType::i32));
    fixed.push_back(r.alloc(t, DType::i32));
  }

  const Dims x = dims_of(in);
  if (lay.cp > 1) {
    // This rank's ids, targets and positions of each micro-batch in flight
    // (nn::Transformer::context_slice): one at a time, all of them under pp.
    for (int64_t mb = 0; mb < (lay.pp > 1 ? in.grad_accum : 1); ++mb) {
      for (int i = 0; i < 3; ++i) fixed.push_back(r.alloc(x.t, DType::i32));
    }
  }
  if (in.widened_bf16_gemm) {
    // Held from the start: what every step after the first holds (the first
    // grows the slots as its GEMMs come, so this bounds it from above).
    const GemmScratch g = widened_gemm_scratch(in, x, chunks, last);
    for (int64_t n : {g.staged_out, g.widened_a, g.widened_b}) {
      if (n > 0) fixed.push_back(r.ws(n, DType::f32));
    }
  }
  std::vector<Dims> seq_chunks;
  if (in.seq_chunk > 0 && in.seq_chunk < in.seq_len) {
    MOETRON_CHECK(lay.pp == 1, "memory model: train.seq_chunk needs parallel.pp = 1");
    for (int64_t begin = 0; begin < in.seq_len; begin += in.seq_chunk) {
      MemoryInputs part = in;
      part.seq_len = std::min(in.seq_chunk, in.seq_len - begin);
      seq_chunks.push_back(dims_of(part));
    }
  }
  replay_step(r, in, x, chunks, first, last, seq_chunks);
  // Under a 2-D grid the embedding's gradient is summed over its grid
  // column last (nn/tensor_parallel_2d.h): its sum's buffer counts here.
  end_of_step_sends(r, rank.reducers, allreduce_sends,
                    lay.tp_rows > 1 && first ? x.v / lay.tp_rows * x.d : 0, in.precision.accum);
  muon_workspace(r, in, plan, inv.params);
  est.peak = r.sim.peak();
  est.total_peak = r.sim.total_peak();
  return est;
}

MemoryEstimate estimate_worst_stage(MemoryInputs in) {
  MemoryEstimate worst;
  for (int64_t s = 0; s < in.layout.pp; ++s) {
    in.layout.stage = s;
    MemoryEstimate e = estimate_memory(in);
    if (s == 0 || e.total_peak > worst.total_peak) worst = e;
  }
  return worst;
}

int64_t largest_fitting_micro_batch(MemoryInputs in, int64_t budget_bytes,
                                    int64_t max_micro_batch) {
  // In multiples of a 2-D grid's rows, which split each micro-batch.
  const int64_t step = std::max<int64_t>(in.layout.tp_rows, 1);
  int64_t lo = 0, hi = max_micro_batch / step;  // invariant: lo fits (0 trivially), answer <= hi
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    in.micro_batch = mid * step;
    if (estimate_worst_stage(in).total_peak <= budget_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo * step;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    MOETRON_FAIL(what, ": cannot read '", text, "' as a size (e.g. 24GiB, 512MB, 1048576)");
  }
  std::string unit = text.substr(pos);
  unit.erase(0, unit.find_first_not_of(' '));
  double mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "K" || unit == "KiB") {
    mult = 1024.0;
  } else if (unit == "M" || unit == "MiB") {
    mult = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GiB") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "TiB") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "KB") {
    mult = 1e3;
  } else if (unit == "MB") {
    mult = 1e6;
  } else if (unit == "GB") {
    mult = 1e9;
  } else if (unit == "TB") {
    mult = 1e12;
  } else {
    MOETRON_FAIL(what, ": unknown unit '", unit, "' in '", text,
                 "' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  }
  if (!(v > 0)) MOETRON_FAIL(what, ": size must be positive, got '", text, "'");
  return static_cast<int64_t>(v * mult);
}

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  MOETRON_FAIL(
      "cannot read MemAvailable from /proc/meminfo; give the budget explicitly (--memory-budget)");
}

}  // namespace moetron::planner
