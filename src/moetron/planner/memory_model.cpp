#include "moetron/planner/memory_model.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/parallel/bucket_plan.h"
#include "moetron/parallel/pipeline_schedule.h"
#include "moetron/planner/gemm_scratch.h"
#include "moetron/planner/memory_replay.h"

namespace moetron::planner {

namespace {

// ---------------------------------------------------------------------------
// Parameters, gradients, optimizer state: as nn::Transformer (for this
// rank's stage, tp shard and experts) and the optimizers allocate them.

struct Param {
  std::string name;
  int64_t numel;
  DType value, grad;
  bool hidden;
  bool expert;   // a routed expert's matrix (placed by ep)
  bool partial;  // gradient partial over tp (reduced over dp x tp)
  bool sharded = false;        // a tp shard (Parameter::sharded())
  int64_t rows = 0, cols = 0;  // of a matrix (the owner plan weighs matrices by their Newton-Schulz cost)
};

struct Inventory {
  std::vector<Param> params;                          // one per nn::Parameter (views included), in order
  std::vector<std::pair<int64_t, DType>> value_bufs;  // allocations tagged params
  std::vector<std::pair<int64_t, DType>> grad_bufs;   // allocations tagged grads
};

Inventory inventory(const MemoryInputs& in, const std::vector<std::pair<int64_t, int64_t>>& chunks, bool first,
                    bool last) {
  const nn::ModelConfig& m = in.model;
  const nn::MoeConfig& e = in.moe;
  const Layout& lay = in.layout;
  const DType c = in.precision.compute, a = in.precision.accum;
  const DType g = in.matrix_grad == DType::f32 ? a : in.matrix_grad;  // hidden matrices' gradients
  const bool tp = lay.tp > 1, sp = tp && lay.sequence_parallel;
  Inventory inv;
  // Matrices are given as rows x cols: numel = rows * cols.
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, DType value, DType grad, bool hidden,
                 bool partial, bool sharded = false) {
    const int64_t numel = rows * cols;
    inv.params.push_back({name, numel, value, grad, hidden, false, partial, sharded, rows, cols});
    inv.value_bufs.emplace_back(numel, value);
    inv.grad_bufs.emplace_back(numel, grad);
  };
  auto view = [&](const std::string& name, int64_t rows, int64_t cols, DType value, DType grad, bool expert,
                  bool partial, bool sharded = false) {
    inv.params.push_back({name, rows * cols, value, grad, true, expert, partial, sharded, rows, cols});
  };
  // The dense FFN is tp-sharded; the shared experts (partial over tp) are not.
  auto swiglu = [&](const std::string& prefix, int64_t hidden, bool partial) {
    const bool sharded = tp && !partial;
    inv.value_bufs.emplace_back(2 * hidden * m.d_model, c);
    inv.grad_bufs.emplace_back(2 * hidden * m.d_model, g);
    view(prefix + "gate_proj.weight", hidden, m.d_model, c, g, false, partial, sharded);
    view(prefix + "up_proj.weight", hidden, m.d_model, c, g, false, partial, sharded);
    add(prefix + "down_proj.weight", m.d_model, hidden, c, g, true, partial, sharded);
  };
  const int64_t d = m.d_model, hd = m.resolved_head_dim(), v = m.vocab_size / lay.tp;
  const int64_t h = m.n_heads / lay.tp, hkv = lay.tp > m.n_kv_heads ? 1 : m.n_kv_heads / lay.tp;
  if (first) add("model.embed_tokens.weight", v, d, c, a, false, false);
  for (const auto& [b0, b1] : chunks) {
    for (int64_t i = b0; i < b1; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", d, 1, a, a, false, sp);
      add(p + "post_attention_layernorm.weight", d, 1, a, a, false, sp);
      add(p + "self_attn.q_proj.weight", h * hd, d, c, g, true, false, tp);
      add(p + "self_attn.k_proj.weight", hkv * hd, d, c, g, true, false, tp);
      add(p + "self_attn.v_proj.weight", hkv * hd, d, c, g, true, false, tp);
      add(p + "self_attn.o_proj.weight", d, h * hd, c, g, true, false, tp);
      if (!nn::layer_is_moe(e, i)) {
        swiglu(p + "mlp.", m.ffn_hidden / lay.tp, false);
        continue;
      }
      // The MoE layers are not tp-sharded: every gradient is partial over tp.
      add(p + "block_sparse_moe.gate.weight", e.num_experts, d, a, a, false, tp);
      const int64_t f = e.expert_hidden, local = e.num_experts / lay.ep;
      inv.value_bufs.emplace_back(local * 2 * f * d, c);
      inv.grad_bufs.emplace_back(local * 2 * f * d, g);
      inv.value_bufs.emplace_back(local * d * f, c);
      inv.grad_bufs.emplace_back(local * d * f, g);
      for (int64_t j = 0; j < local; ++j) {  // (names are this rank's; only the sizes matter here)
        const std::string ex = p + "block_sparse_moe.experts." + std::to_string(j) + ".";
        view(ex + "w1.weight", f, d, c, g, true, tp);
        view(ex + "w3.weight", f, d, c, g, true, tp);
        view(ex + "w2.weight", d, f, c, g, true, tp);
      }
      inv.value_bufs.emplace_back(e.num_experts, a);  // selection bias
      if (e.shared_experts > 0) {
        swiglu(p + "mlp.shared_experts.", (e.shared_expert_hidden > 0 ? e.shared_expert_hidden : f) * e.shared_experts,
               tp);
      }
    }
  }
  if (last) {
    add("model.norm.weight", d, 1, a, a, false, sp);
    if (!m.tie_embeddings) add("lm_head.weight", v, d, c, a, false, false);
  }
  return inv;
}

bool uses_muon(const MemoryInputs& in, const Param& p) {
  if (in.optimizer != "muon" || !p.hidden) return false;
  for (const auto& pat : in.adamw_patterns) {
    if (::fnmatch(pat.c_str(), p.name.c_str(), 0) == 0) return false;
  }
  return true;
}

// parallel::flat_bucket_plan over the carried parameters: last registered
// first, a bucket closed once it reaches bucket_bytes of fp32, each padded
// to a multiple of the group size.
struct Bucket {
  int64_t numel = 0;
  std::vector<std::pair<const Param*, int64_t>> slots;  // parameter, offset
};
template <typename Carries>
std::vector<Bucket> flat_plan(const Inventory& inv, int64_t n, int64_t bucket_bytes, Carries carries) {
  std::vector<Bucket> out;
  Bucket cur;
  const auto close = [&] {
    cur.numel = (cur.numel + n - 1) / n * n;
    out.push_back(std::move(cur));
    cur = Bucket{};
  };
  for (size_t i = inv.params.size(); i-- > 0;) {
    const Param& p = inv.params[i];
    if (!carries(p)) continue;
    cur.slots.emplace_back(&p, cur.numel);
    cur.numel += p.numel;
    if (cur.numel * 4 >= bucket_bytes) close();
  }
  if (!cur.slots.empty()) close();
  return out;
}

// parallel::owner_bucket_plan: Muon's matrices grouped until bucket_bytes,
// each group's matrices dealt to the rank with the least Newton-Schulz work
// so far (largest first), chunk = the largest rank's share; the rest flat.
template <typename Owned, typename Carries>
std::vector<Bucket> owner_plan(const Inventory& inv, int64_t n, int64_t bucket_bytes, Owned owned, Carries carries) {
  std::vector<Bucket> out;
  std::vector<double> load(static_cast<size_t>(n), 0.0);
  std::vector<const Param*> group;
  int64_t group_numel = 0;
  Bucket flat;
  const auto close_group = [&] {
    if (group.empty()) return;
    std::vector<const Param*> order = group;
    std::stable_sort(order.begin(), order.end(), [](const Param* x, const Param* y) {
      return parallel::newton_schulz_cost(x->rows, x->cols) > parallel::newton_schulz_cost(y->rows, y->cols);
    });
    std::vector<std::vector<const Param*>> per_rank(static_cast<size_t>(n));
    for (const Param* p : order) {
      const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[r] += parallel::newton_schulz_cost(p->rows, p->cols);
      per_rank[r].push_back(p);
    }
    int64_t chunk = 1;
    for (const auto& ps : per_rank) {
      int64_t sum = 0;
      for (const Param* p : ps) sum += p->numel;
      chunk = std::max(chunk, sum);
    }
    Bucket b;
    for (size_t r = 0; r < per_rank.size(); ++r) {
      int64_t off = static_cast<int64_t>(r) * chunk;
      for (const Param* p : per_rank[r]) {
        b.slots.emplace_back(p, off);
        off += p->numel;
      }
    }
    b.numel = chunk * n;
    out.push_back(std::move(b));
    group.clear();
    group_numel = 0;
  };
  const auto close_flat = [&] {
    if (flat.slots.empty()) return;
    flat.numel = (flat.numel + n - 1) / n * n;
    out.push_back(std::move(flat));
    flat = Bucket{};
  };
  for (size_t i = inv.params.size(); i-- > 0;) {
    const Param& p = inv.params[i];
    if (!carries(p)) continue;
    if (owned(p)) {
      group.push_back(&p);
      group_numel += p.numel;
      if (group_numel * 4 >= bucket_bytes) close_group();
    } else {
      flat.slots.emplace_back(&p, flat.numel);
      flat.numel += p.numel;
      if (flat.numel * 4 >= bucket_bytes) close_flat();
    }
  }
  close_group();
  close_flat();
  return out;
}

// A GradReducer's buffers over a group of n ranks; `sends` collects the
// buckets an uncompressed all-reduce copies into a send buffer.
void reducer_buffers(Replay& r, std::vector<Buf>& fixed, const std::vector<Bucket>& plan, int64_t n,
                     bool reduce_scatter, const parallel::CompressOptions& co, std::vector<int64_t>& sends) {
  for (const Bucket& b : plan) {
    const int64_t chunk = b.numel / n;
    fixed.push_back(r.alloc(b.numel, DType::f32, MemTag::comm));
    if (reduce_scatter) fixed.push_back(r.alloc(chunk, DType::f32, MemTag::comm));
    if (co.kind == parallel::CompressKind::none) {
      if (!reduce_scatter) sends.push_back(b.numel);
      continue;
    }
    const int64_t enc = parallel::encoded_bytes(co, chunk);
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
// master where the working copy is not fp32, the first moment (Muon's
// momentum), the second for AdamW.
void optimizer_state(Replay& r, std::vector<Buf>& fixed, const MemoryInputs& in, const Param& p) {
  const DType master = in.precision.accum;
  if (p.value != master) fixed.push_back(r.alloc(p.numel, master, MemTag::optimizer));
  const DType mom = in.moment_dtype == DType::f32 ? master : in.moment_dtype;
  fixed.push_back(r.alloc(p.numel, mom, MemTag::optimizer));
  if (!uses_muon(in, p)) fixed.push_back(r.alloc(p.numel, mom, MemTag::optimizer));
}

// ZeroOptimizer over a reducer's buckets: fp32 master and m of this rank's
// chunk, v of its AdamW elements; the working copies' all-gather buffers; Muon's update
// all-gather where a matrix straddles a chunk boundary (every matrix when
// the orthogonalisation is replicated).
void zero_state(Replay& r, std::vector<Buf>& fixed, const MemoryInputs& in, const std::vector<Bucket>& plan,
                int64_t n) {
  const DType mom = in.moment_dtype;
  for (const Bucket& b : plan) {
    const int64_t chunk = b.numel / n;
    fixed.push_back(r.alloc(chunk, DType::f32, MemTag::optimizer));
    fixed.push_back(r.alloc(chunk, mom, MemTag::optimizer));
    // AdamW's second moment: only the AdamW elements, as much as the fullest chunk holds.
    std::vector<std::pair<int64_t, int64_t>> adamw;
    for (const auto& [p, offset] : b.slots) {
      if (!uses_muon(in, *p)) adamw.emplace_back(offset, p->numel);
    }
    const int64_t v_len = parallel::max_chunk_share(adamw, chunk, n);
    if (v_len > 0) fixed.push_back(r.alloc(v_len, mom, MemTag::optimizer));
    DType value = b.slots.empty() ? DType::f32 : b.slots.back().first->value;
    bool muon = false, gather_u = false;
    for (const auto& [p, offset] : b.slots) {
      if (p->value != value) value = DType::f32;
      if (uses_muon(in, *p)) {
        muon = true;
        if (offset / chunk != (offset + p->numel - 1) / chunk || in.muon_distribution == "replicated") {
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

MemoryEstimate estimate_memory(const MemoryInputs& in) {
  const Layout& lay = in.layout;
  const nn::ModelConfig& m = in.model;
  const nn::MoeConfig& e = in.moe;
  MOETRON_CHECK(lay.dp >= 1 && lay.tp >= 1 && lay.pp >= 1 && lay.ep >= 1 && lay.vpp >= 1,
                "memory model: every parallel degree must be >= 1");
  MOETRON_CHECK(lay.cp == 1, "memory model: context parallelism (parallel.cp = ", lay.cp, ") is not modelled yet");
  MOETRON_CHECK(lay.stage >= 0 && lay.stage < lay.pp, "memory model: stage ", lay.stage, " of parallel.pp = ", lay.pp);
  MOETRON_CHECK(in.micro_batch >= 1 && in.seq_len >= 1 && in.grad_accum >= 1,
                "memory model: micro_batch, seq_len and grad_accum must be positive");
  MOETRON_CHECK(m.n_heads % lay.tp == 0 && m.vocab_size % lay.tp == 0 && m.ffn_hidden % lay.tp == 0,
                "memory model: parallel.tp = ", lay.tp,
                " must divide model.n_heads, model.vocab_size and model.ffn_hidden");
  MOETRON_CHECK(e.num_experts % lay.ep == 0, "memory model: parallel.ep = ", lay.ep, " must divide moe.num_experts");
  const bool sp = lay.tp > 1 && lay.sequence_parallel;
  const int64_t t = in.micro_batch * in.seq_len;
  MOETRON_CHECK(lay.tp == 1 || t % lay.tp == 0, "memory model: the ", t,
                " tokens of a micro-batch must divide over parallel.tp = ", lay.tp);
  MOETRON_CHECK(lay.stages.empty() || (lay.vpp == 1 && static_cast<int64_t>(lay.stages.size()) == lay.pp),
                "memory model: ", lay.stages.size(), " stage splits given for parallel.pp = ", lay.pp,
                " (and vpp = ", lay.vpp, ")");
  const std::vector<std::pair<int64_t, int64_t>> chunks =
      lay.pp == 1            ? std::vector<std::pair<int64_t, int64_t>>{{0, m.n_layers}}
      : !lay.stages.empty() ? std::vector<std::pair<int64_t, int64_t>>{lay.stages[static_cast<size_t>(lay.stage)]}
                            : parallel::stage_chunks(m, e, in.seq_len, lay.pp, lay.vpp, lay.stage);
  const bool first = lay.stage == 0, last = lay.stage == lay.pp - 1;
  const Inventory inv = inventory(in, chunks, first, last);
  Replay r;
  MemoryEstimate est;
  std::vector<Buf> fixed;
  for (const auto& [n, dt] : inv.value_bufs) fixed.push_back(r.alloc(n, dt, MemTag::params));
  for (const auto& [n, dt] : inv.grad_bufs) fixed.push_back(r.alloc(n, dt, MemTag::grads));
  for (const Param& p : inv.params) est.param_count += p.numel;

  // Reducers as the trainer builds them (train/trainer.cpp): experts over
  // their replicas, tp-partial gradients over the stage, the rest over dp.
  const int64_t ranks = lay.dp * lay.tp;
  const auto is_expert = [&](const Param& p) { return lay.ep > 1 && p.expert; };
  const auto is_partial = [&](const Param& p) { return p.partial && !is_expert(p); };
  const auto is_dense = [&](const Param& p) { return !is_expert(p) && !is_partial(p); };
  std::vector<Bucket> dense_plan, partial_plan;
  std::vector<int64_t> allreduce_sends;
  const bool owner_muon = lay.zero1 && in.optimizer == "muon" && in.muon_distribution == "owner";
  if (ranks > 1 || lay.zero1) {
    const ReducerInputs& ri = in.reducer;
    if (lay.ep > 1 && ranks / lay.ep > 1) {
      reducer_buffers(r, fixed, flat_plan(inv, ranks / lay.ep, ri.bucket_bytes, is_expert), ranks / lay.ep, false,
                      ri.compress, allreduce_sends);
    }
    if (lay.tp > 1) {
      // Under ZeRO-1 reduce-scattered over the stage (owner plan for FlexMuon), which shards their state.
      partial_plan = owner_muon ? owner_plan(inv, ranks, ri.bucket_bytes, [&](const Param& p) { return uses_muon(in, p); },
                                             is_partial)
                                : flat_plan(inv, ranks, ri.bucket_bytes, is_partial);
      reducer_buffers(r, fixed, partial_plan, ranks, lay.zero1, ri.compress, allreduce_sends);
    }
    if (lay.dp > 1 || lay.zero1) {
      dense_plan = owner_muon ? owner_plan(inv, lay.dp, ri.bucket_bytes, [&](const Param& p) { return uses_muon(in, p); },
                                           is_dense)
                              : flat_plan(inv, lay.dp, ri.bucket_bytes, is_dense);
      reducer_buffers(r, fixed, dense_plan, lay.dp, lay.zero1, ri.compress, allreduce_sends);
    }
  }
  // Optimizer state: ZeRO-1 holds the dense state in dp chunks and the
  // tp-partial state in chunks over the stage, and updates routed experts
  // (under ep) whole; otherwise every parameter has its slots.
  if (lay.zero1) {
    zero_state(r, fixed, in, dense_plan, lay.dp);
    if (lay.tp > 1) zero_state(r, fixed, in, partial_plan, ranks);
    for (const Param& p : inv.params) {
      if (is_expert(p)) optimizer_state(r, fixed, in, p);
    }
  } else {
    for (const Param& p : inv.params) optimizer_state(r, fixed, in, p);
  }
  // The step's batch buffers (inputs and targets of every micro-batch).
  for (int64_t mb = 0; mb < in.grad_accum; ++mb) {
    fixed.push_back(r.alloc(t, DType::i32));
    fixed.push_back(r.alloc(t, DType::i32));
  }

  Dims x;
  x.b = in.micro_batch;
  x.s = in.seq_len;
  x.t = t;
  x.tp = lay.tp;
  x.ep = lay.ep;
  x.sp = sp;
  x.tb = sp ? t / lay.tp : t;
  x.tm = lay.tp > 1 ? t / lay.tp : t;
  x.d = m.d_model;
  x.h = m.n_heads / lay.tp;
  x.hkv = lay.tp > m.n_kv_heads ? 1 : m.n_kv_heads / lay.tp;
  x.hd = m.resolved_head_dim();
  x.ffn = m.ffn_hidden / lay.tp;
  x.v = m.vocab_size / lay.tp;
  x.e = std::max<int64_t>(e.num_experts, 1);
  x.k = e.top_k;
  x.f = e.expert_hidden;
  x.shared_hidden = (e.shared_expert_hidden > 0 ? e.shared_expert_hidden : e.expert_hidden) * e.shared_experts;
  x.rows_local = x.tm * e.top_k;
  if (e.capacity_factor > 0) {
    // Capacity per expert over the ep group's tokens (moe_dispatch.cpp);
    // balanced routing gives each rank its share of the kept slots.
    const auto cap = static_cast<int64_t>(
        std::ceil(static_cast<double>(lay.ep * x.tm * e.top_k) * e.capacity_factor / static_cast<double>(x.e)));
    x.rows_local = std::min(x.rows_local, ceil_div(cap * x.e, lay.ep));
  }
  x.rows_expert = x.rows_local;
  x.threads = std::max<int64_t>(in.threads, 1);
  x.c = in.precision.compute;
  x.a = in.precision.accum;
  x.aux = e.aux_loss_coef > 0;
  x.z = e.z_loss_coef > 0;
  if (in.widened_bf16_gemm) {
    // Held from the start: what every step after the first holds (the first
    // grows the slots as its GEMMs come, so this bounds it from above).
    const GemmScratch g = widened_gemm_scratch(in, x, chunks, last);
    for (int64_t n : {g.staged_out, g.widened_a, g.widened_b}) {
      if (n > 0) fixed.push_back(r.ws(n, DType::f32));
    }
  }
  replay_step(r, in, x, chunks, first, last);
  {
    // Uncompressed all-reduces copy each bucket into a send buffer held
    // until the reduction completes (comm/mpi_communicator.cpp): at the end
    // of backward every bucket's copy is in flight.
    std::vector<Buf> sends;
    for (int64_t n : allreduce_sends) sends.push_back(r.alloc(n, DType::f32, MemTag::comm));
  }
  {  // Muon's update of its largest matrix: u, o, the iterate and its update,
     // two Gram matrices; a tp-sharded matrix is gathered and orthogonalised whole.
    int64_t shard = 0, whole = 0;
    for (const Param& p : inv.params) {
      if (!uses_muon(in, p)) continue;
      if (p.numel * (p.sharded ? lay.tp : 1) > whole) {
        whole = p.numel * (p.sharded ? lay.tp : 1);
        shard = p.sharded ? p.numel : 0;
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
  int64_t lo = 0, hi = max_micro_batch;  // invariant: lo fits (0 trivially), answer <= hi
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    in.micro_batch = mid;
    if (estimate_worst_stage(in).total_peak <= budget_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
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
