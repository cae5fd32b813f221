#include "moetron/planner/memory_replay.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "moetron/core/error.h"
#include "moetron/kernels/attention.h"
#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/norm.h"
#include "moetron/planner/memory_model.h"
#include "moetron/planner/memory_replay_context.h"
#include "moetron/planner/memory_replay_grid.h"

namespace moetron::planner {

Buf Replay::alloc(int64_t elems, DType dt, MemTag tag) {
  const int64_t bytes = elems * static_cast<int64_t>(dtype_size(dt));
  if (bytes <= 0) return nullptr;
  const auto n = static_cast<int64_t>(Allocator::rounded(static_cast<size_t>(bytes)));
  sim.add(tag, n);
  return std::make_shared<Held>(&sim, tag, n);
}

namespace {

// The memory model sizes the CPU backend's kernels.
constexpr kernels::Backend kCpu = kernels::Backend::cpu;

struct AttnSaved {
  Buf x, q, k, v, out, lse, positions;
  Buf out_heads;  // all-to-all context parallelism: the head-split output
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

// What a pipeline chunk keeps per micro-batch between its forward and backward.
struct ChunkStash {
  std::vector<BlockSaved> blocks;
  Buf positions, rstd, d_h, x_final;
  std::vector<Buf> segment_inputs, routing;  // recompute full / sqrt
  int64_t last_segment = 0;
  bool head_deferred = false;  // a sequence chunk's head runs again in backward
};

class StepReplay {
 public:
  StepReplay(Replay& r, const MemoryInputs& in, const Dims& x) : r_(r), in_(in), x_(x) {
    const auto& p = in.recompute;
    drop_core_ = p.drops(nn::Recompute::attn_core);
    drop_act_ = p.drops(nn::Recompute::moe_act);
    drop_norm_ = p.drops(nn::Recompute::norm);
    drop_dispatch_ = p.drops(nn::Recompute::moe_dispatch);
    drop_out_ = p.drops(nn::Recompute::moe_out) && x.ep == 1;
    drop_q_ = p.drops(nn::Recompute::attn_q);
    drop_kv_ = p.drops(nn::Recompute::attn_kv);
    drop_residual_ = p.drops(nn::Recompute::attn_residual) && x.tp == 1;
    blocks_.resize(static_cast<size_t>(in.model.n_layers));
    k_ = in.recompute.segment;
  }

  // One stage holding every layer: Transformer::forward_backward.
  void run_whole() {
    const Dims& x = x_;
    const auto n = static_cast<int64_t>(in_.model.n_layers);
    const int64_t k = in_.recompute.segment, last = k > 0 ? (n - 1) / k * k : 0;
    Buf positions = r_.alloc(x.t, DType::i32);
    Buf h_final, losses, d_x;
    {
      Buf cur = embed();
      std::vector<Buf> ckpt, routing(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        if (k > 0 && i < last && i % k == 0) ckpt.push_back(cur);
        cur = gathered_block_forward(i, cur);
        if (i < last) {
          if (blocks_[static_cast<size_t>(i)].is_moe)
            routing[static_cast<size_t>(i)] = blocks_[static_cast<size_t>(i)].moe.idx;
          blocks_[static_cast<size_t>(i)] = BlockSaved{};
        }
      }
      Buf x_final = cur;
      cur = nullptr;
      Buf rstd = r_.alloc(x.tb, x.a);
      h_final = r_.alloc(x.tb * x.d, x.c);
      const auto head_weights = grid_.vocab();
      std::vector<Buf> gathered = grid_.gather(head_weights, true, true);
      Buf h_full = x.sp ? r_.alloc(x.t * x.d, x.c) : nullptr;  // column-parallel input of the head
      losses = r_.alloc(x.t, x.a);
      Buf d_h = r_.alloc(x.t * x.d, x.c);
      head_workspace();
      grid_.finish(head_weights, gathered);
      d_x = r_.alloc(x.tb * x.d, x.c);
      { std::vector<Buf> partial = norm_partial(); }
      d_h = nullptr;
      x_final = nullptr;
      for (int64_t start = last, end = n; end > 0;
           end = start, start = std::max<int64_t>(start - k, 0)) {
        if (start < last) {
          Buf in = std::move(ckpt[static_cast<size_t>(start / k)]);
          for (int64_t i = start; i < end; ++i) {
            routing[static_cast<size_t>(i)] = nullptr;  // the check drops the record
            in = gathered_block_forward(i, in);
          }
        }
        for (int64_t i = end - 1; i >= start; --i) d_x = gathered_block_backward(i);
      }
      ckpt.clear();
    }
    embed_backward(d_x);
  }

  // A pipeline stage: its chunks run in the schedule's order.
  void run_pipeline(const std::vector<std::pair<int64_t, int64_t>>& chunks, bool first_stage,
                    bool last_stage) {
    const int64_t m = in_.grad_accum, v = static_cast<int64_t>(chunks.size()), pp = in_.layout.pp;
    run_ops(parallel::pipeline_schedule(in_.layout.schedule, pp, in_.layout.stage, m, v), chunks,
            first_stage, last_stage, {});
  }

  // Chunked sequences (nn/transformer_chunked.cpp): the chunks (`parts`,
  // each one's dims) run forward in order, then backward in reverse, like
  // micro-batches of one stage; every layer holds the whole sequence's keys
  // and values, and from its first backward their gradients' sums.
  void run_sequence_chunks(const std::vector<Dims>& parts) {
    const Dims whole = x_;
    const auto n = static_cast<int64_t>(parts.size()), layers = in_.model.n_layers;
    std::vector<parallel::PipeOp> ops;
    for (int64_t i = 0; i < n; ++i) ops.push_back({.forward = true, .mb = i, .chunk = 0});
    for (int64_t i = n; i-- > 0;) ops.push_back({.forward = false, .mb = i, .chunk = 0});
    Buf positions = r_.alloc(whole.t, DType::i32);
    std::vector<Buf> cache;
    for (int64_t i = 0; i < 2 * layers; ++i)
      cache.push_back(r_.alloc(whole.t * whole.hkv * whole.hd, whole.c));
    kv_grads_.assign(static_cast<size_t>(layers), {});
    chunked_seq_ = whole.s;
    run_ops(ops, {{0, layers}}, true, true, parts);
    kv_grads_.clear();
    chunked_seq_ = 0;
    x_ = whole;
  }

 private:
  // Runs `ops` over the stage's chunks; sent tensors are held until the
  // next send (PipelineRunner releases delivered ones then). With `parts`,
  // op.mb is a chunk of the sequence with those dims.
  void run_ops(const std::vector<parallel::PipeOp>& ops,
               const std::vector<std::pair<int64_t, int64_t>>& chunks, bool first_stage,
               bool last_stage, const std::vector<Dims>& parts) {
    const Dims& x = x_;
    const auto v = static_cast<int64_t>(chunks.size());
    std::map<std::pair<int64_t, int64_t>, ChunkStash> stash;
    std::vector<Buf> sends;
    const auto send = [&](Buf b) {
      sends.clear();
      sends.push_back(std::move(b));
    };
    for (const parallel::PipeOp& op : ops) {
      if (!parts.empty()) {
        x_ = parts[static_cast<size_t>(op.mb)];
        chunk_offset_ = op.mb * parts[0].s;
      }
      const bool first = op.chunk == 0 && first_stage, last = op.chunk == v - 1 && last_stage;
      const auto [b0, b1] = chunks[static_cast<size_t>(op.chunk)];
      if (op.forward) {
        ChunkStash st;
        Buf cur = first ? embed() : r_.alloc(x.tb * x.d, x.c);  // the received activations
        st.positions = r_.alloc(x.t, DType::i32);
        // Every sequence chunk but the last is checkpointed whole (ChunkStep::checkpoint_all).
        const bool all = !parts.empty() && op.mb + 1 < static_cast<int64_t>(parts.size()) && k_ > 0;
        const int64_t last_segment = all ? b1 : last_segment_start(b0, b1);
        st.last_segment = last_segment;
        st.head_deferred = all;
        for (int64_t i = b0; i < b1; ++i) {
          if (i < last_segment && (i - b0) % k_ == 0) st.segment_inputs.push_back(cur);
          cur = gathered_block_forward(i, cur);
          BlockSaved& s = blocks_[static_cast<size_t>(i)];
          if (i < last_segment) {
            st.routing.push_back(s.is_moe ? s.moe.idx : nullptr);  // the routing record
            st.blocks.emplace_back();
          } else {
            st.blocks.push_back(std::move(s));
          }
          s = BlockSaved{};
        }
        if (last) {
          head_forward(st, !st.head_deferred);
          if (st.head_deferred) st.rstd = nullptr;
          st.x_final = cur;
          cur = nullptr;
        } else {
          send(std::move(cur));
        }
        stash[{op.chunk, op.mb}] = std::move(st);
      } else {
        auto it = stash.find({op.chunk, op.mb});
        MOETRON_CHECK(it != stash.end(), "memory model: pipeline backward without its forward");
        ChunkStash st = std::move(it->second);
        stash.erase(it);
        if (last && st.head_deferred) head_forward(st, true);
        // The received gradient, or on the last stage the final norm's backward output.
        Buf d_x = r_.alloc(x.tb * x.d, x.c);
        if (last) std::vector<Buf> partial = norm_partial();
        const int64_t last_segment = st.last_segment;
        for (const auto& [start, end] : backward_segments(b0, b1, last_segment)) {
          if (start < last_segment) {
            Buf in = std::move(st.segment_inputs[static_cast<size_t>((start - b0) / k_)]);
            for (int64_t i = start; i < end; ++i) {
              st.routing[static_cast<size_t>(i - b0)] = nullptr;  // the check drops the record
              in = gathered_block_forward(i, in);
            }
          } else {
            for (int64_t i = start; i < end; ++i) {
              blocks_[static_cast<size_t>(i)] = std::move(st.blocks[static_cast<size_t>(i - b0)]);
            }
          }
          for (int64_t i = end - 1; i >= start; --i) d_x = gathered_block_backward(i);
        }
        st = ChunkStash{};
        if (first) {
          embed_backward(d_x);
        } else {
          send(std::move(d_x));
        }
      }
    }
    sends.clear();
  }

  // Transformer::head_forward: the final norm and the fused cross-entropy
  // (its gradient d_h with `backward`).
  void head_forward(ChunkStash& st, bool backward) {
    const Dims& x = x_;
    st.rstd = r_.alloc(x.tb, x.a);
    Buf h = r_.alloc(x.tb * x.d, x.c);
    const auto weights = grid_.vocab();
    std::vector<Buf> gathered = grid_.gather(weights, true, backward);
    Buf h_full = x.sp ? r_.alloc(x.t * x.d, x.c) : nullptr;
    Buf losses = r_.alloc(x.t, x.a);
    if (backward) st.d_h = r_.alloc(x.t * x.d, x.c);
    head_workspace();
    if (backward) grid_.finish(weights, gathered);
  }

  // A block's forward (backward) with its 2-D grid weights gathered around
  // it (and its gradients summed back after it): nothing without a grid.
  Buf gathered_block_forward(int64_t i, const Buf& in) {
    std::vector<Buf> weights = grid_.gather(grid_.block(i), true, false);
    return block_forward(i, in);
  }
  Buf gathered_block_backward(int64_t i) {
    const auto weights = grid_.block(i);
    std::vector<Buf> gathered = grid_.gather(weights, true, true);
    Buf d_x = block_backward(i);
    grid_.finish(weights, gathered);
    return d_x;
  }

  // Transformer::backward_segments: the kept last segment, then the
  // checkpointed ones from the last.
  std::vector<std::pair<int64_t, int64_t>> backward_segments(int64_t b0, int64_t b1,
                                                             int64_t last_segment) const {
    std::vector<std::pair<int64_t, int64_t>> segments;
    if (last_segment < b1) segments.emplace_back(last_segment, b1);
    std::vector<int64_t> starts;
    for (int64_t s = b0; s < last_segment; s += k_) starts.push_back(s);
    for (size_t j = starts.size(); j-- > 0;)
      segments.emplace_back(starts[j], std::min(starts[j] + k_, last_segment));
    return segments;
  }

  Buf embed() {
    const Dims& x = x_;
    std::vector<Buf> gathered = grid_.gather(grid_.vocab(), true, false);
    Buf full = r_.alloc(x.t * x.d, x.c);
    if (!x.sp) return full;
    return r_.alloc(x.tb * x.d, x.c);  // reduce-scattered to this rank's slice
  }

  void embed_backward(const Buf& d_x) {
    const Dims& x = x_;
    Buf d_full = x.sp ? r_.alloc(x.t * x.d, x.c) : d_x;
    std::vector<Buf> gathered = grid_.gather(grid_.vocab(), false, true);
    // This rank's rows of the (vocab-parallel under tp) table. Under a 2-D
    // grid, its sum over the grid column is counted with the reducers'
    // sends at the end of the step (memory_model.cpp), when it happens.
    std::vector<Buf> scratch = hold(kernels::embedding_backward_scratch(kCpu, x.t, x.v, x.d, x.c));
  }

  // The cross-entropy's chunk buffers: nn/vocab_parallel_ce.cpp's under tp,
  // else the fused kernel's own.
  void head_workspace() {
    const Dims& x = x_;
    const int64_t chunk = std::min(in_.ce_chunk_tokens, x.t);
    if (x.tp > 1) {
      Buf logits = r_.ws(chunk * x.v, DType::f32), mx = r_.ws(chunk, DType::f32),
          sums = r_.ws(2 * chunk, DType::f32);
      Buf h32 = x.c != DType::f32 ? r_.ws(chunk * x.d, DType::f32) : nullptr;
      Buf dl = x.c == DType::bf16 ? r_.ws(chunk * x.v, DType::bf16) : nullptr;
      return;
    }
    kernels::CrossEntropyFusedShape shape;
    shape.tokens = x.t;
    shape.vocab = x.v;
    shape.dim = x.d;
    shape.chunk_tokens = in_.ce_chunk_tokens;
    shape.dtype = x.c;
    std::vector<Buf> scratch = hold(kernels::cross_entropy_fused_scratch(kCpu, shape));
  }

  // rmsnorm_backward's scratch (its dw partials) over this rank's rows.
  std::vector<Buf> norm_partial() {
    return hold(kernels::rmsnorm_backward_scratch(kCpu, x_.tb, x_.d, x_.c));
  }

  // A kernel call's scratch, allocated and held until the result goes.
  std::vector<Buf> hold(const kernels::Scratch& scratch) {
    std::vector<Buf> held;
    for (const kernels::ScratchBuffer& b : scratch) {
      for (int64_t th = 0; th < (b.per_thread ? x_.threads : 1); ++th) {
        held.push_back(r_.ws(b.elems, b.dtype));
      }
    }
    return held;
  }

  // The attention kernels' scratch for this rank's heads, held.
  std::vector<Buf> attention_scratch(bool backward) {
    const Dims& x = x_;
    // A sequence chunk's calls go one sequence at a time over the keys up to its end.
    const bool chunk = chunked_seq_ > 0;
    return attention_scratch(backward, chunk ? 1 : x.b, x.s, chunk ? chunk_offset_ + x.s : x.s);
  }
  std::vector<Buf> attention_scratch(bool backward, int64_t batch, int64_t seq_q, int64_t seq_k) {
    const Dims& x = x_;
    const kernels::AttentionShape shape{.batch = batch,
                                        .seq_q = seq_q,
                                        .seq_k = seq_k,
                                        .heads = x.h,
                                        .kv_heads = x.hkv,
                                        .head_dim = x.hd,
                                        .dtype = x.c};
    return hold(backward ? kernels::attention_backward_scratch(kCpu, shape)
                         : kernels::attention_forward_scratch(kCpu, shape));
  }

  // Block::forward; the saved state goes to blocks_[i].
  Buf block_forward(int64_t i, const Buf& in) {
    const Dims& x = x_;
    BlockSaved s;
    s.x = in;
    s.is_moe = nn::layer_is_moe(in_.moe, i);
    s.rstd1 = r_.alloc(x.tb, x.a);
    Buf n1 = r_.alloc(x.tb * x.d, x.c);
    s.h = r_.alloc(x.tb * x.d, x.c);
    s.attn = attn_forward(n1, i);
    if (drop_norm_) s.attn.x = nullptr;
    s.rstd2 = r_.alloc(x.tb, x.a);
    Buf n2 = r_.alloc(x.tb * x.d, x.c);
    Buf out = r_.alloc(x.tb * x.d, x.c);
    if (s.is_moe) {
      // Under tp without sp the MoE takes a view of this rank's token slice
      // and its output is all-gathered from a slice-sized buffer.
      Buf moe_out = x.tp > 1 && !x.sp ? r_.alloc(x.tm * x.d, x.c) : nullptr;
      s.moe = moe_forward(n2);
      if (drop_norm_) {
        if (s.moe.x_router == s.moe.x) s.moe.x_router = nullptr;
        s.moe.x = nullptr;
        s.moe.shared.x = nullptr;
      }
    } else {
      s.mlp = mlp_forward(n2, x.ffn, true);
      if (drop_norm_) s.mlp.x = nullptr;
    }
    if (drop_residual_) s.h = nullptr;
    blocks_[static_cast<size_t>(i)] = std::move(s);
    return out;
  }

  // The column-parallel input: all-gathered under sp, else the given tensor.
  Buf column_input(const Buf& given) { return x_.sp ? r_.alloc(x_.t * x_.d, x_.c) : given; }
  // A row-parallel output under sp: the [t, D] partial, reduce-scattered into a slice.
  void row_output() {
    if (!x_.sp) return;
    Buf partial = r_.alloc(x_.t * x_.d, x_.c);
    Buf slice = r_.alloc(x_.tb * x_.d, x_.c);
  }

  AttnSaved attn_forward(const Buf& n1, int64_t layer) {
    const Dims& x = x_;
    AttnSaved s;
    s.x = column_input(n1);
    s.q = r_.alloc(x.t * x.h * x.hd, x.c);
    s.k = r_.alloc(x.t * x.hkv * x.hd, x.c);
    s.v = r_.alloc(x.t * x.hkv * x.hd, x.c);
    s.out = r_.alloc(x.t * x.h * x.hd, x.c);
    s.lse = r_.alloc(x.b * x.h * x.s, x.a);
    if (chunked_seq_ > 0) s.k = s.v = nullptr;  // copied into the sequence's cache
    if (x.cp_all_to_all) {
      cp_.ulysses_forward(s.q, s.k, s.v, s.lse, s.out, s.out_heads);
    } else if (x.cp > 1) {
      std::tie(s.k, s.v) = cp_.ring_forward(layer);
    } else {
      std::vector<Buf> scratch = attention_scratch(false);
    }
    row_output();
    if (drop_core_) s.out = s.out_heads = nullptr;
    if (whole_sequence()) {
      if (drop_q_) s.q = nullptr;
      if (drop_kv_) s.k = s.v = nullptr;
    }
    return s;
  }

  // tensor_parallel: the dense FFN (sharded over tp); the shared experts are not.
  MlpSaved mlp_forward(const Buf& in, int64_t hidden, bool tensor_parallel) {
    MlpSaved s;
    const int64_t t = tensor_parallel ? x_.t : x_.tm;
    s.x = tensor_parallel ? column_input(in) : in;
    s.gate_up = r_.alloc(t * 2 * hidden, x_.c);
    s.act = r_.alloc(t * hidden, x_.c);
    if (tensor_parallel) row_output();
    if (drop_act_) s.act = nullptr;
    return s;
  }

  // MoeLayer::to_experts / from_experts: the exchanged rows staged in a
  // comm buffer of the experts' rows, then permuted into `rows_out` rows.
  Buf exchange(int64_t rows_out) {
    Buf staged = r_.alloc(x_.rows_expert * x_.d, x_.c, MemTag::comm);
    return r_.alloc(rows_out * x_.d, x_.c);
  }
  // MoeLayer::dispatch: the permuted local rows, sent to their experts' ranks under ep.
  Buf dispatch() {
    Buf local = r_.alloc(x_.rows_local * x_.d, x_.c);
    return x_.ep == 1 ? local : exchange(x_.rows_expert);
  }

  MoeSaved moe_forward(const Buf& in) {
    const Dims& x = x_;
    MoeSaved s;
    s.x = in;
    s.x_router = x.c == x.a ? in : r_.alloc(x.tm * x.d, x.a);
    s.logits = r_.alloc(x.tm * x.e, x.a);
    s.scores = r_.alloc(x.tm * x.e, x.a);
    s.idx = r_.alloc(x.tm * x.k, DType::i32);
    s.weight = r_.alloc(x.tm * x.k, x.a);
    if (x.ep > 1) Buf counts = r_.alloc((x.e + 1) * (x.ep + 1), DType::i64, MemTag::comm);
    s.permuted = dispatch();
    s.gate_up = r_.alloc(x.rows_expert * 2 * x.f, x.c);
    s.act = r_.alloc(x.rows_expert * x.f, x.c);
    s.expert_out = r_.alloc(x.rows_expert * x.d, x.c);
    if (x.ep > 1) s.expert_out = exchange(x.rows_local);
    if (in_.moe.shared_experts > 0) {
      s.shared = mlp_forward(in, x.shared_hidden, false);
      s.has_shared = true;
    }
    if (x.aux || x.z) Buf scratch = r_.alloc(x.tm * x.e, x.a);
    if (drop_act_) s.act = nullptr;
    if (drop_out_) s.expert_out = nullptr;
    if (drop_dispatch_) {
      s.permuted = nullptr;
      if (s.x_router != s.x) s.x_router = nullptr;
    }
    return s;
  }

  Buf rebuild_norm() {
    Buf rstd = r_.alloc(x_.tb, x_.a);
    return r_.alloc(x_.tb * x_.d, x_.c);
  }

  Buf block_backward(int64_t i) {  // the caller holds d_out
    const Dims& x = x_;
    BlockSaved& s = blocks_[static_cast<size_t>(i)];
    if (!s.h) {  // Block::rebuild_residual
      if (!s.attn.out && !s.attn.x) s.attn.x = column_input(rebuild_norm());
      s.h = r_.alloc(x.tb * x.d, x.c);
      if (!s.attn.out) {
        rebuild_projections(s.attn);
        rebuild_output(s.attn);
      }
    }
    Buf d_n2 = r_.alloc(x.tb * x.d, x.c);
    if (drop_norm_) {
      Buf n2 = rebuild_norm();
      if (s.is_moe) {
        s.moe.x = n2;
        if (s.moe.has_shared) s.moe.shared.x = n2;
      } else {
        s.mlp.x = column_input(n2);
      }
    }
    if (s.is_moe) {
      Buf d_slice = x.tp > 1 && !x.sp ? r_.alloc(x.tm * x.d, x.c) : nullptr;
      moe_backward(s.moe);
    } else {
      mlp_backward(s.mlp, x.ffn, true);
    }
    Buf d_h = r_.alloc(x.tb * x.d, x.c);
    { std::vector<Buf> partial = norm_partial(); }
    if (drop_norm_ && !s.attn.x) s.attn.x = column_input(rebuild_norm());
    attn_backward(s.attn, i);
    Buf d_x = r_.alloc(x.tb * x.d, x.c);
    { std::vector<Buf> partial = norm_partial(); }
    s = BlockSaved{};
    return d_x;
  }

  void mlp_backward(MlpSaved& s, int64_t hidden, bool tensor_parallel) {
    const int64_t t = tensor_parallel ? x_.t : x_.tm;
    Buf dy = tensor_parallel && x_.sp ? r_.alloc(x_.t * x_.d, x_.c) : nullptr;
    if (!s.act) s.act = r_.alloc(t * hidden, x_.c);
    Buf d_act = r_.alloc(t * hidden, x_.c);
    s.act = nullptr;
    Buf d_gate_up = std::move(s.gate_up);  // written over the gate-up product
    d_act = nullptr;
    if (tensor_parallel) row_output();
    s = MlpSaved{};
  }

  void moe_backward(MoeSaved& s) {
    const Dims& x = x_;
    if (s.has_shared) mlp_backward(s.shared, x.shared_hidden, false);
    Buf d_expert_out = r_.alloc(x.rows_local * x.d, x.c);
    Buf d_topk_weight = r_.alloc(x.tm * x.k, x.a);
    if (s.expert_out && x.ep > 1) d_expert_out = exchange(x.rows_expert);
    Buf d_act = r_.alloc(x.rows_expert * x.f, x.c);
    if (!s.act) s.act = r_.alloc(x.rows_expert * x.f, x.c);
    d_expert_out = nullptr;
    s.act = nullptr;
    Buf d_gate_up = std::move(s.gate_up);  // written over the gate-up product
    d_act = nullptr;
    if (!s.permuted) s.permuted = dispatch();
    Buf d_permuted = r_.alloc(x.rows_expert * x.d, x.c);
    d_gate_up = nullptr;
    if (x.ep > 1) d_permuted = exchange(x.rows_local);
    { Buf d_routed = r_.alloc(x.tm * x.d, x.c); }
    Buf d_scores = x.aux ? r_.alloc(x.tm * x.e, x.a) : nullptr;
    Buf d_logits_z = x.z ? r_.alloc(x.tm * x.e, x.a) : nullptr;
    Buf d_logits = r_.alloc(x.tm * x.e, x.a);
    if (!s.x_router) s.x_router = x.c == x.a ? s.x : r_.alloc(x.tm * x.d, x.a);
    if (x.c != x.a) {
      Buf dx_router = r_.alloc(x.tm * x.d, x.a);
      Buf dx_router_c = r_.alloc(x.tm * x.d, x.c);
    }
    s = MoeSaved{};
  }

  // SelfAttention::rebuild_projections: q, k, v dropped by attn_q / attn_kv.
  void rebuild_projections(AttnSaved& s) {
    if (!whole_sequence()) return;
    if (!s.q) s.q = r_.alloc(x_.t * x_.h * x_.hd, x_.c);
    if (!s.k) {
      s.k = r_.alloc(x_.t * x_.hkv * x_.hd, x_.c);
      s.v = r_.alloc(x_.t * x_.hkv * x_.hd, x_.c);
    }
  }

  // SelfAttention::rebuild_output: the attention output dropped by attn_core.
  void rebuild_output(AttnSaved& s) {
    const Dims& x = x_;
    if (s.out) return;
    if (x.cp_all_to_all) return cp_.ulysses_core(s.out, s.out_heads);
    s.out = r_.alloc(x.t * x.h * x.hd, x.c);
    Buf lse = r_.alloc(x.b * x.h * x.s, x.a);
    if (x.cp > 1) {
      cp_.prefix_forward();
    } else {
      std::vector<Buf> scratch = attention_scratch(false);
    }
  }

  // Projections are dropped and rebuilt only for whole sequences on one rank.
  bool whole_sequence() const { return x_.cp == 1 && chunked_seq_ == 0; }

  void attn_backward(AttnSaved& s, int64_t layer) {
    const Dims& x = x_;
    Buf dy = x.sp ? r_.alloc(x.t * x.d, x.c) : nullptr;
    rebuild_projections(s);
    rebuild_output(s);
    Buf d_out = r_.alloc(x.t * x.h * x.hd, x.c);
    Buf dq = r_.alloc(x.t * x.h * x.hd, x.c);
    Buf dk = r_.alloc(x.t * x.hkv * x.hd, x.c);
    Buf dv = r_.alloc(x.t * x.hkv * x.hd, x.c);
    if (x.cp_all_to_all) {
      cp_.ulysses_backward();
    } else if (x.cp > 1) {
      cp_.ring_backward();
    } else if (chunked_seq_ > 0) {
      // The sequence's dK, dV sums (from the layer's first backward on), and
      // the chunk's contribution over the keys up to its end.
      auto& sums = kv_grads_[static_cast<size_t>(layer)];
      if (!sums.first) {
        sums.first = r_.alloc(x.b * chunked_seq_ * x.hkv * x.hd, x.a);
        sums.second = r_.alloc(x.b * chunked_seq_ * x.hkv * x.hd, x.a);
      }
      const int64_t prefix = chunk_offset_ + x.s;
      Buf dk_prefix = r_.ws(prefix * x.hkv * x.hd, x.c),
          dv_prefix = r_.ws(prefix * x.hkv * x.hd, x.c);
      std::vector<Buf> scratch = attention_scratch(true);
    } else {
      std::vector<Buf> scratch = attention_scratch(true);
    }
    d_out = nullptr;
    if (x.tp > in_.model.n_kv_heads) {
      // Replicated kv heads: each weight gradient is summed over the ranks sharing it.
      Buf dw = r_.ws(x.hkv * x.hd * x.d, in_.precision.accum);
    }
    row_output();
    s = AttnSaved{};
  }

  // Transformer::last_segment_start of a chunk: blocks before it are checkpointed.
  int64_t last_segment_start(int64_t b0, int64_t b1) const {
    return k_ > 0 ? b0 + (b1 - b0 - 1) / k_ * k_ : b0;
  }

  Replay& r_;
  const MemoryInputs& in_;
  Dims x_;
  ContextAttentionReplay cp_{r_, in_, x_};  // reads x_ as it changes
  GridWeightsReplay grid_{r_, in_, x_};
  int64_t k_ = 0;  // blocks per checkpointed segment
  bool drop_core_, drop_act_, drop_norm_, drop_dispatch_, drop_out_, drop_q_, drop_kv_,
      drop_residual_;
  std::vector<BlockSaved> blocks_;
  // Chunked sequences: the whole sequence's length (0: not chunked), where
  // the current chunk starts, and each layer's dK, dV sums.
  int64_t chunked_seq_ = 0, chunk_offset_ = 0;
  std::vector<std::pair<Buf, Buf>> kv_grads_;
};

}  // namespace

void replay_step(Replay& r, const MemoryInputs& in, const Dims& x,
                 const std::vector<std::pair<int64_t, int64_t>>& chunks, bool first_stage,
                 bool last_stage, const std::vector<Dims>& seq_chunks) {
  StepReplay step(r, in, x);
  if (!seq_chunks.empty()) {
    step.run_sequence_chunks(seq_chunks);
  } else if (in.layout.pp == 1) {
    step.run_whole();
  } else {
    step.run_pipeline(chunks, first_stage, last_stage);
  }
}

}  // namespace moetron::planner
