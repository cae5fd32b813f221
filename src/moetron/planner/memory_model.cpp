#include "moetron/planner/memory_model.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::planner {

namespace {

// ---------------------------------------------------------------------------
// Replay of allocations: a Buf frees its bytes when its last handle goes, as
// a Tensor does, so the replay below reads like the code it mirrors.
class Sim {
 public:
  int64_t cur(MemTag t) const { return cur_[static_cast<size_t>(t)]; }
  void add(MemTag t, int64_t n) {
    cur_[static_cast<size_t>(t)] += n;
    total_ += n;
    peak_[static_cast<size_t>(t)] =
        std::max(peak_[static_cast<size_t>(t)], cur_[static_cast<size_t>(t)]);
    total_peak_ = std::max(total_peak_, total_);
  }
  const std::array<int64_t, kNumMemTags>& peak() const { return peak_; }
  int64_t total_peak() const { return total_peak_; }

 private:
  std::array<int64_t, kNumMemTags> cur_{}, peak_{};
  int64_t total_ = 0, total_peak_ = 0;
};

struct Held {
  Held(Sim* s, MemTag t, int64_t n) : sim(s), tag(t), bytes(n) {}
  ~Held() { sim->add(tag, -bytes); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  Sim* sim;
  MemTag tag;
  int64_t bytes;
};
using Buf = std::shared_ptr<Held>;

struct Replay {
  Sim sim;
  Buf alloc(int64_t elems, DType dt, MemTag tag = MemTag::activations) {
    const int64_t bytes = elems * static_cast<int64_t>(dtype_size(dt));
    if (bytes <= 0) return nullptr;
    const auto n = static_cast<int64_t>(Allocator::rounded(static_cast<size_t>(bytes)));
    sim.add(tag, n);
    return std::make_shared<Held>(&sim, tag, n);
  }
  Buf ws(int64_t elems, DType dt) { return alloc(elems, dt, MemTag::workspace); }
};

// ---------------------------------------------------------------------------
// Parameters, gradients, optimizer state: as nn::Transformer and
// optim::Optimizer allocate them.

struct Param {
  std::string name;
  int64_t numel;
  DType value, grad;
  bool hidden;
};

struct Inventory {
  std::vector<Param> params;                          // one per nn::Parameter (views included)
  std::vector<std::pair<int64_t, DType>> value_bufs;  // allocations tagged params
  std::vector<std::pair<int64_t, DType>> grad_bufs;   // allocations tagged grads
  int64_t max_muon_workspace = 0;
};

Inventory inventory(const MemoryInputs& in) {
  const nn::ModelConfig& m = in.model;
  const nn::MoeConfig& e = in.moe;
  const DType c = in.precision.compute, a = in.precision.accum;
  const DType g = a;  // every gradient is in the accumulation dtype
  Inventory inv;
  auto add = [&](const std::string& name, int64_t numel, DType value, DType grad, bool hidden) {
    inv.params.push_back({name, numel, value, grad, hidden});
    inv.value_bufs.emplace_back(numel, value);
    inv.grad_bufs.emplace_back(numel, grad);
  };
  auto view = [&](const std::string& name, int64_t numel, DType value, DType grad) {
    inv.params.push_back({name, numel, value, grad, true});
  };
  auto swiglu = [&](const std::string& prefix, int64_t hidden) {
    inv.value_bufs.emplace_back(2 * hidden * m.d_model, c);
    inv.grad_bufs.emplace_back(2 * hidden * m.d_model, g);
    view(prefix + "gate_proj.weight", hidden * m.d_model, c, g);
    view(prefix + "up_proj.weight", hidden * m.d_model, c, g);
    add(prefix + "down_proj.weight", m.d_model * hidden, c, g, true);
  };
  const int64_t d = m.d_model, hd = m.resolved_head_dim();
  add("model.embed_tokens.weight", m.vocab_size * d, c, a, false);
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", d, a, a, false);
    add(p + "post_attention_layernorm.weight", d, a, a, false);
    add(p + "self_attn.q_proj.weight", m.n_heads * hd * d, c, g, true);
    add(p + "self_attn.k_proj.weight", m.n_kv_heads * hd * d, c, g, true);
    add(p + "self_attn.v_proj.weight", m.n_kv_heads * hd * d, c, g, true);
    add(p + "self_attn.o_proj.weight", d * m.n_heads * hd, c, g, true);
    if (!nn::layer_is_moe(e, i)) {
      swiglu(p + "mlp.", m.ffn_hidden);
      continue;
    }
    add(p + "block_sparse_moe.gate.weight", e.num_experts * d, a, a, false);
    const int64_t f = e.expert_hidden;
    inv.value_bufs.emplace_back(e.num_experts * 2 * f * d, c);
    inv.grad_bufs.emplace_back(e.num_experts * 2 * f * d, g);
    inv.value_bufs.emplace_back(e.num_experts * d * f, c);
    inv.grad_bufs.emplace_back(e.num_experts * d * f, g);
    for (int64_t j = 0; j < e.num_experts; ++j) {
      const std::string ex = p + "block_sparse_moe.experts." + std::to_string(j) + ".";
      view(ex + "w1.weight", f * d, c, g);
      view(ex + "w3.weight", f * d, c, g);
      view(ex + "w2.weight", d * f, c, g);
    }
    inv.value_bufs.emplace_back(e.num_experts, a);  // selection bias
    if (e.shared_experts > 0) {
      swiglu(p + "mlp.shared_experts.",
             (e.shared_expert_hidden > 0 ? e.shared_expert_hidden : f) * e.shared_experts);
    }
  }
  add("model.norm.weight", d, a, a, false);
  if (!m.tie_embeddings) add("lm_head.weight", m.vocab_size * d, c, a, false);
  return inv;
}

bool uses_muon(const MemoryInputs& in, const Param& p) {
  if (in.optimizer != "muon" || !p.hidden) return false;
  for (const auto& pat : in.adamw_patterns) {
    if (::fnmatch(pat.c_str(), p.name.c_str(), 0) == 0) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Activations and workspace of one forward_backward, mirroring nn/.

struct Dims {
  int64_t b, s, t, d, h, hkv, hd, v, e, k, f, rows, threads;
  DType c, a;
  bool aux, z, use_bias;
};

// Per-thread scratch of the blockwise attention kernels (kernels/cpu/attention_*.cpp).
constexpr int64_t kTile = 64;
int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

void attention_forward_scratch(Replay& r, const Dims& x, std::vector<Buf>& held) {
  const int64_t hdp = round_up(x.hd, 16), nkb = (x.s + kTile - 1) / kTile, tile = kTile * hdp;
  for (int64_t th = 0; th < x.threads; ++th) {
    for (int64_t n : {nkb * tile, nkb * tile, tile, kTile * hdp, kTile * kTile})
      held.push_back(r.ws(n, x.c));
    held.push_back(r.ws(nkb, DType::i64));
    for (int64_t n : {kTile * kTile, kTile * hdp, kTile, kTile, kTile})
      held.push_back(r.ws(n, DType::f32));
  }
}

void attention_backward_scratch(Replay& r, const Dims& x, std::vector<Buf>& held) {
  const int64_t hdp = round_up(x.hd, 16), nkb = (x.s + kTile - 1) / kTile, nqb = nkb;
  const int64_t ktile = kTile * hdp, qtile = kTile * hdp, pk = dtype_size(x.c) == 2 ? 2 : 1;
  if (x.h / x.hkv > 1) held.push_back(r.ws(2 * x.b * x.h * nkb * ktile, DType::f32));
  for (int64_t th = 0; th < x.threads; ++th) {
    for (int64_t n : {nkb * ktile, nkb * ktile, nkb * ktile, nqb * qtile, nqb * qtile})
      held.push_back(r.ws(n, x.c));
    if (pk > 1) {
      held.push_back(r.ws(nqb * qtile, x.c));
      held.push_back(r.ws(nqb * qtile, x.c));
    }
    held.push_back(r.ws(ktile, x.c));
    for (int64_t n :
         {nqb * kTile, nqb * kTile, nqb * qtile, ktile, ktile, kTile * kTile, kTile * kTile}) {
      held.push_back(r.ws(n, DType::f32));
    }
    for (int64_t n : {kTile * kTile, kTile * kTile, kTile * kTile}) held.push_back(r.ws(n, x.c));
  }
}

struct AttnSaved {
  Buf x, q, k, v, out, lse;
};
struct MlpSaved {
  Buf x, gate_up, act;
};
struct MoeSaved {
  Buf x, x_router, logits, scores, idx, weight, permuted, gate_up, act, expert_out;
  MlpSaved shared;
  bool has_shared = false;
};
struct BlockSaved {
  Buf x, h, rstd1, rstd2;
  AttnSaved attn;
  MlpSaved mlp;
  MoeSaved moe;
  bool is_moe = false;
};

class StepReplay {
 public:
  StepReplay(Replay& r, const MemoryInputs& in, const Dims& x) : r_(r), in_(in), x_(x) {
    const auto& p = in.recompute;
    drop_core_ = p.drops(nn::Recompute::attn_core);
    drop_act_ = p.drops(nn::Recompute::moe_act);
    drop_norm_ = p.drops(nn::Recompute::norm);
    drop_dispatch_ = p.drops(nn::Recompute::moe_dispatch);
  }

  void run() {
    const Dims& x = x_;
    const auto n = static_cast<int64_t>(in_.model.n_layers);
    const int64_t k = in_.recompute.segment, last = k > 0 ? (n - 1) / k * k : 0;
    Buf positions = r_.alloc(x.t, DType::i32);
    Buf h_final;
    Buf losses;
    Buf d_x;
    {
      Buf cur = r_.alloc(x.t * x.d, x.c);  // embedding output
      blocks_.resize(static_cast<size_t>(n));
      std::vector<Buf> ckpt, routing(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        if (k > 0 && i < last && i % k == 0) ckpt.push_back(cur);
        cur = block_forward(i, cur);
        if (i < last) {
          if (blocks_[static_cast<size_t>(i)].is_moe)
            routing[static_cast<size_t>(i)] = blocks_[static_cast<size_t>(i)].moe.idx;
          blocks_[static_cast<size_t>(i)] = BlockSaved{};
        }
      }
      Buf x_final = cur;
      cur = nullptr;
      Buf rstd = r_.alloc(x.t, x.a);
      h_final = r_.alloc(x.t * x.d, x.c);
      losses = r_.alloc(x.t, x.a);
      Buf d_h = r_.alloc(x.t * x.d, x.c);
      {
        const int64_t chunk = std::min(in_.ce_chunk_tokens, x.t);
        Buf logits = r_.ws(chunk * x.v, DType::f32);
        Buf dl = x.c == DType::bf16 ? r_.ws(chunk * x.v, DType::bf16) : nullptr;
        Buf hf = x.c == DType::bf16 ? r_.ws(chunk * x.d, DType::f32) : nullptr;
      }
      d_x = r_.alloc(x.t * x.d, x.c);
      { Buf partial = norm_partial(); }
      d_h = nullptr;
      x_final = nullptr;
      // backward_blocks
      for (int64_t start = last, end = n; end > 0;
           end = start, start = std::max<int64_t>(start - k, 0)) {
        if (start < last) {
          Buf in = std::move(ckpt[static_cast<size_t>(start / k)]);
          for (int64_t i = start; i < end; ++i) {
            routing[static_cast<size_t>(i)] = nullptr;  // the check drops the record
            in = block_forward(i, in);
          }
        }
        for (int64_t i = end - 1; i >= start; --i) d_x = block_backward(i);
      }
      ckpt.clear();
    }
    {  // embedding backward scratch
      Buf start = r_.ws(x.v + 1, DType::i64), order = r_.ws(x.t, DType::i64),
          fill = r_.ws(x.v, DType::i64);
    }
  }

 private:
  Buf norm_partial() {
    constexpr int64_t kMinChunkRows = 64, kMaxChunks = 64;
    const int64_t rows = std::max(kMinChunkRows, (x_.t + kMaxChunks - 1) / kMaxChunks);
    return r_.ws((x_.t + rows - 1) / rows * x_.d, DType::f32);
  }

  Buf block_forward(int64_t i, const Buf& in) {
    const Dims& x = x_;
    BlockSaved s;
    s.x = in;
    s.is_moe = nn::layer_is_moe(in_.moe, i);
    s.rstd1 = r_.alloc(x.t, x.a);
    Buf n1 = r_.alloc(x.t * x.d, x.c);
    s.h = r_.alloc(x.t * x.d, x.c);
    s.attn = attn_forward(n1);
    if (drop_norm_) s.attn.x = nullptr;
    s.rstd2 = r_.alloc(x.t, x.a);
    Buf n2 = r_.alloc(x.t * x.d, x.c);
    Buf out = r_.alloc(x.t * x.d, x.c);
    if (s.is_moe) {
      s.moe = moe_forward(n2);
      if (drop_norm_) {
        if (s.moe.x_router == s.moe.x) s.moe.x_router = nullptr;
        s.moe.x = nullptr;
        s.moe.shared.x = nullptr;
      }
    } else {
      s.mlp = mlp_forward(n2, in_.model.ffn_hidden);
      if (drop_norm_) s.mlp.x = nullptr;
    }
    blocks_[static_cast<size_t>(i)] = std::move(s);
    return out;
  }

  AttnSaved attn_forward(const Buf& n1) {
    const Dims& x = x_;
    AttnSaved s;
    s.x = n1;
    s.q = r_.alloc(x.t * x.h * x.hd, x.c);
    s.k = r_.alloc(x.t * x.hkv * x.hd, x.c);
    s.v = r_.alloc(x.t * x.hkv * x.hd, x.c);
    s.out = r_.alloc(x.t * x.h * x.hd, x.c);
    s.lse = r_.alloc(x.b * x.h * x.s, x.a);
    {
      std::vector<Buf> scratch;
      attention_forward_scratch(r_, x, scratch);
    }
    if (drop_core_) s.out = nullptr;
    return s;
  }

  MlpSaved mlp_forward(const Buf& in, int64_t hidden) {
    MlpSaved s;
    s.x = in;
    s.gate_up = r_.alloc(x_.t * 2 * hidden, x_.c);
    s.act = r_.alloc(x_.t * hidden, x_.c);
    if (drop_act_) s.act = nullptr;
    return s;
  }

  int64_t shared_hidden() const {
    const auto& e = in_.moe;
    return (e.shared_expert_hidden > 0 ? e.shared_expert_hidden : e.expert_hidden) *
           e.shared_experts;
  }

  MoeSaved moe_forward(const Buf& in) {
    const Dims& x = x_;
    MoeSaved s;
    s.x = in;
    s.x_router = x.c == x.a ? in : r_.alloc(x.t * x.d, x.a);
    s.logits = r_.alloc(x.t * x.e, x.a);
    s.scores = r_.alloc(x.t * x.e, x.a);
    s.idx = r_.alloc(x.t * x.k, DType::i32);
    s.weight = r_.alloc(x.t * x.k, x.a);
    s.permuted = r_.alloc(x.rows * x.d, x.c);
    s.gate_up = r_.alloc(x.rows * 2 * x.f, x.c);
    s.act = r_.alloc(x.rows * x.f, x.c);
    s.expert_out = r_.alloc(x.rows * x.d, x.c);
    if (in_.moe.shared_experts > 0) {
      s.shared = mlp_forward(in, shared_hidden());
      s.has_shared = true;
    }
    if (x.aux || x.z) Buf scratch = r_.alloc(x.t * x.e, x.a);
    if (drop_act_) s.act = nullptr;
    if (drop_dispatch_) {
      s.permuted = nullptr;
      if (s.x_router != s.x) s.x_router = nullptr;
    }
    return s;
  }

  Buf rebuild_norm() {
    Buf rstd = r_.alloc(x_.t, x_.a);
    return r_.alloc(x_.t * x_.d, x_.c);
  }

  Buf block_backward(int64_t i) {  // the caller holds d_out
    const Dims& x = x_;
    BlockSaved& s = blocks_[static_cast<size_t>(i)];
    Buf d_n2 = r_.alloc(x.t * x.d, x.c);
    if (drop_norm_) {
      Buf n2 = rebuild_norm();
      if (s.is_moe) {
        s.moe.x = n2;
        if (s.moe.has_shared) s.moe.shared.x = n2;
      } else {
        s.mlp.x = n2;
      }
    }
    if (s.is_moe) {
      moe_backward(s.moe);
    } else {
      mlp_backward(s.mlp, in_.model.ffn_hidden);
    }
    Buf d_h = r_.alloc(x.t * x.d, x.c);
    { Buf partial = norm_partial(); }
    if (drop_norm_) s.attn.x = rebuild_norm();
    attn_backward(s.attn);
    Buf d_x = r_.alloc(x.t * x.d, x.c);
    { Buf partial = norm_partial(); }
    s = BlockSaved{};
    return d_x;
  }

  void mlp_backward(MlpSaved& s, int64_t hidden) {
    if (!s.act) s.act = r_.alloc(x_.t * hidden, x_.c);
    Buf d_act = r_.alloc(x_.t * hidden, x_.c);
    Buf d_gate_up = r_.alloc(x_.t * 2 * hidden, x_.c);
    s = MlpSaved{};
  }

  void moe_backward(MoeSaved& s) {
    const Dims& x = x_;
    if (s.has_shared) mlp_backward(s.shared, shared_hidden());
    if (!s.act) s.act = r_.alloc(x.rows * x.f, x.c);
    Buf d_expert_out = r_.alloc(x.rows * x.d, x.c);
    Buf d_topk_weight = r_.alloc(x.t * x.k, x.a);
    Buf d_act = r_.alloc(x.rows * x.f, x.c);
    d_expert_out = nullptr;
    Buf d_gate_up = r_.alloc(x.rows * 2 * x.f, x.c);
    d_act = nullptr;
    if (!s.permuted) s.permuted = r_.alloc(x.rows * x.d, x.c);
    Buf d_permuted = r_.alloc(x.rows * x.d, x.c);
    d_gate_up = nullptr;
    { Buf d_routed = r_.alloc(x.t * x.d, x.c); }
    Buf d_scores = x.aux ? r_.alloc(x.t * x.e, x.a) : nullptr;
    Buf d_logits_z = x.z ? r_.alloc(x.t * x.e, x.a) : nullptr;
    Buf d_logits = r_.alloc(x.t * x.e, x.a);
    if (!s.x_router) s.x_router = x.c == x.a ? s.x : r_.alloc(x.t * x.d, x.a);
    if (x.c != x.a) {
      Buf dx_router = r_.alloc(x.t * x.d, x.a);
      Buf dx_router_c = r_.alloc(x.t * x.d, x.c);
    }
    s = MoeSaved{};
  }

  void attn_backward(AttnSaved& s) {
    const Dims& x = x_;
    if (!s.out) {
      s.out = r_.alloc(x.t * x.h * x.hd, x.c);
      Buf lse = r_.alloc(x.b * x.h * x.s, x.a);
      std::vector<Buf> scratch;
      attention_forward_scratch(r_, x, scratch);
    }
    Buf d_out = r_.alloc(x.t * x.h * x.hd, x.c);
    Buf dq = r_.alloc(x.t * x.h * x.hd, x.c);
    Buf dk = r_.alloc(x.t * x.hkv * x.hd, x.c);
    Buf dv = r_.alloc(x.t * x.hkv * x.hd, x.c);
    {
      std::vector<Buf> scratch;
      attention_backward_scratch(r_, x, scratch);
    }
    d_out = nullptr;
    s = AttnSaved{};
  }

  Replay& r_;
  const MemoryInputs& in_;
  Dims x_;
  bool drop_core_, drop_act_, drop_norm_, drop_dispatch_;
  std::vector<BlockSaved> blocks_;
};

int64_t shard(int64_t n, int64_t parts) {
  return (n + parts - 1) / parts;
}

}  // namespace

MemoryEstimate estimate_memory(const MemoryInputs& in) {
  const Layout& lay = in.layout;
  MOETRON_CHECK(lay.dp >= 1, "memory model: dp must be >= 1");
  if (lay.tp != 1 || lay.pp != 1 || lay.ep != 1 || lay.cp != 1) {
    MOETRON_FAIL("memory model: tensor, pipeline, expert and context parallel layouts (tp ", lay.tp,
                 ", pp ", lay.pp, ", ep ", lay.ep, ", cp ", lay.cp,
                 ") are not modelled yet; only dp (with or without zero1)");
  }
  MOETRON_CHECK(in.micro_batch >= 1 && in.seq_len >= 1 && in.grad_accum >= 1,
                "memory model: micro_batch, seq_len and grad_accum must be positive");
  const Inventory inv = inventory(in);
  Replay r;
  MemoryEstimate est;
  // Parameters and gradients: every rank holds all of them (dp replicates).
  std::vector<Buf> fixed;
  for (const auto& [n, dt] : inv.value_bufs) fixed.push_back(r.alloc(n, dt, MemTag::params));
  for (const auto& [n, dt] : inv.grad_bufs) fixed.push_back(r.alloc(n, dt, MemTag::grads));
  // Optimizer state: fp32 master where the working copy is not fp32, first
  // moment (or Muon momentum), second moment for AdamW; split over dp under ZeRO-1.
  const int64_t parts = lay.zero1 ? lay.dp : 1;
  int64_t muon_ws = 0;
  for (const Param& p : inv.params) {
    est.param_count += p.numel;
    const DType master = in.precision.accum;
    const int64_t n = shard(p.numel, parts);
    if (p.value != master) fixed.push_back(r.alloc(n, master, MemTag::optimizer));
    const bool muon = uses_muon(in, p);
    fixed.push_back(r.alloc(n, master, MemTag::optimizer));
    if (!muon) fixed.push_back(r.alloc(n, master, MemTag::optimizer));
    if (muon) muon_ws = std::max(muon_ws, p.numel);
  }
  // The step's batch buffers (inputs and targets of every micro-batch).
  const int64_t t = in.micro_batch * in.seq_len;
  for (int64_t m = 0; m < in.grad_accum; ++m) {
    fixed.push_back(r.alloc(t, DType::i32));
    fixed.push_back(r.alloc(t, DType::i32));
  }
  Dims x{};
  const nn::ModelConfig& m = in.model;
  const nn::MoeConfig& e = in.moe;
  x.b = in.micro_batch;
  x.s = in.seq_len;
  x.t = t;
  x.d = m.d_model;
  x.h = m.n_heads;
  x.hkv = m.n_kv_heads;
  x.hd = m.resolved_head_dim();
  x.v = m.vocab_size;
  x.e = std::max<int64_t>(e.num_experts, 1);
  x.k = e.top_k;
  x.f = e.expert_hidden;
  x.rows = t * e.top_k;
  if (e.capacity_factor > 0) {
    const auto cap = static_cast<int64_t>(
        std::ceil(static_cast<double>(t * e.top_k) * e.capacity_factor / static_cast<double>(x.e)));
    x.rows = std::min(x.rows, cap * x.e);
  }
  x.threads = std::max<int64_t>(in.threads, 1);
  x.c = in.precision.compute;
  x.a = in.precision.accum;
  x.aux = e.aux_loss_coef > 0;
  x.z = e.z_loss_coef > 0;
  // One micro-batch's forward and backward at a time: the peak of one.
  StepReplay(r, in, x).run();
  {  // Muon's update of its largest matrix: u, o, the iterate and its update, two Gram matrices.
    const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(muon_ws)));
    std::vector<Buf> ws;
    for (int i = 0; i < 4 && muon_ws > 0; ++i) ws.push_back(r.ws(muon_ws, in.precision.accum));
    for (int i = 0; i < 2 && muon_ws > 0; ++i) ws.push_back(r.ws(side * side, in.precision.accum));
  }
  est.peak = r.sim.peak();
  est.total_peak = r.sim.total_peak();
  return est;
}

int64_t largest_fitting_micro_batch(MemoryInputs in, int64_t budget_bytes,
                                    int64_t max_micro_batch) {
  int64_t lo = 0, hi = max_micro_batch;  // invariant: lo fits (0 trivially), answer <= hi
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    in.micro_batch = mid;
    if (estimate_memory(in).total_peak <= budget_bytes) {
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
