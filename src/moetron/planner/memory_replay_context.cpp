#include "moetron/planner/memory_replay_context.h"

#include <algorithm>

#include "moetron/kernels/attention.h"
#include "moetron/nn/context_parallel.h"

namespace moetron::planner {

namespace {
constexpr kernels::Backend kCpu = kernels::Backend::cpu;
}  // namespace

std::vector<Buf> ContextAttentionReplay::hold(const kernels::Scratch& scratch) {
  std::vector<Buf> held;
  for (const kernels::ScratchBuffer& b : scratch) {
    for (int64_t th = 0; th < (b.per_thread ? x_.threads : 1); ++th)
      held.push_back(r_.ws(b.elems, b.dtype));
  }
  return held;
}

std::vector<Buf> ContextAttentionReplay::attention_scratch(bool backward, int64_t batch,
                                                           int64_t seq_q, int64_t seq_k,
                                                           int64_t head_share) {
  const kernels::AttentionShape shape{.batch = batch,
                                      .seq_q = seq_q,
                                      .seq_k = seq_k,
                                      .heads = x_.h / head_share,
                                      .kv_heads = x_.hkv / head_share,
                                      .head_dim = x_.hd,
                                      .dtype = x_.c};
  return hold(backward ? kernels::attention_backward_scratch(kCpu, shape)
                       : kernels::attention_forward_scratch(kCpu, shape));
}

std::pair<Buf, Buf> ContextAttentionReplay::ring_forward(int64_t layer) {
  const Dims& x = x_;
  const int64_t kv_all = x.b * x.cp_seq * x.hkv * x.hd, c = chunk();
  kernels::AttentionMask mask;
  if (nn::layer_is_local(in_.model, layer)) {
    mask.window = in_.model.attention_window;
    mask.num_global = in_.model.attention_global_tokens;
  }
  nn::ContextParallel cp;
  cp.size = x.cp;
  cp.rank = x.cp_rank;
  cp.seq = x.cp_seq;
  cp.documents = in_.document_mask;
  const size_t hops = nn::context_ring_offsets(cp, mask).size();
  Buf k_all = r_.alloc(kv_all, x.c), v_all = r_.alloc(kv_all, x.c);
  // The own block stays (it is sent at every distance); from the second
  // exchange on, the block in hand and the one arriving sit beside it.
  // Every later exchange holds the same, so three stand for all.
  Buf own = r_.alloc(2 * x.t * x.hkv * x.hd, x.c, MemTag::comm);
  Buf acc = r_.ws(x.t * x.h * x.hd, x.a);
  Buf current;
  for (size_t i = 0; i <= std::min<size_t>(hops, 2); ++i) {
    Buf incoming = i < hops ? r_.alloc(2 * x.t * x.hkv * x.hd, x.c, MemTag::comm) : nullptr;
    {
      Buf part = r_.ws(c * x.h * x.hd, x.c), part_acc = r_.ws(c * x.h * x.hd, x.a);
      Buf part_lse = r_.ws(x.h * c, x.a);
      std::vector<Buf> scratch = attention_scratch(false, 1, c, c, 1);
    }
    if (i == hops) break;
    current = std::move(incoming);
  }
  return {std::move(k_all), std::move(v_all)};
}

void ContextAttentionReplay::prefix_forward() {
  Buf chunk_lse = r_.ws(x_.h * chunk(), x_.a);
  std::vector<Buf> scratch = attention_scratch(false, 1, chunk(), longest_prefix(), 1);
}

void ContextAttentionReplay::ring_backward() {
  const Dims& x = x_;
  const int64_t kv_all = x.b * x.cp_seq * x.hkv * x.hd, c = chunk();
  Buf dk_sum = r_.ws(kv_all, x.a), dv_sum = r_.ws(kv_all, x.a);
  Buf dk_part = r_.ws(x.cp_seq * x.hkv * x.hd, x.c), dv_part = r_.ws(x.cp_seq * x.hkv * x.hd, x.c);
  Buf chunk_lse = r_.ws(x.h * c, x.a);
  { std::vector<Buf> scratch = attention_scratch(true, 1, c, longest_prefix(), 1); }
  Buf send = r_.alloc(x.cp * 2 * x.t * x.hkv * x.hd, x.a, MemTag::comm);
  Buf mine = r_.alloc(2 * x.t * x.hkv * x.hd, x.a, MemTag::comm);
}

Buf ContextAttentionReplay::exchange_heads(int64_t elems) {
  Buf send = r_.alloc(elems, x_.c, MemTag::comm), recv = r_.alloc(elems, x_.c, MemTag::comm);
  return r_.alloc(elems, x_.c);
}

void ContextAttentionReplay::exchange_back(int64_t elems) {
  Buf send = r_.alloc(elems, x_.c, MemTag::comm), recv = r_.alloc(elems, x_.c, MemTag::comm);
}

void ContextAttentionReplay::ulysses_forward(Buf& q, Buf& k, Buf& v, Buf& lse, Buf& out,
                                             Buf& out_heads) {
  const Dims& x = x_;
  const int64_t qn = x.t * x.h * x.hd, kvn = x.t * x.hkv * x.hd;
  q = exchange_heads(qn);
  k = exchange_heads(kvn);
  v = exchange_heads(kvn);
  Buf heads_lse = r_.alloc(x.b * x.h * x.s, x.a);
  lse = std::move(heads_lse);
  ulysses_core(out, out_heads);
}

void ContextAttentionReplay::ulysses_core(Buf& out, Buf& out_heads) {
  const Dims& x = x_;
  out_heads = r_.alloc(x.t * x.h * x.hd, x.c);
  if (!out) out = r_.alloc(x.t * x.h * x.hd, x.c);
  { std::vector<Buf> scratch = attention_scratch(false, x.b, x.cp_seq, x.cp_seq, x.cp); }
  exchange_back(x.t * x.h * x.hd);
}

void ContextAttentionReplay::ulysses_backward() {
  const Dims& x = x_;
  const int64_t qn = x.t * x.h * x.hd, kvn = x.t * x.hkv * x.hd;
  Buf d_out_heads = exchange_heads(qn);
  Buf dq = r_.alloc(qn, x.c), dk = r_.alloc(kvn, x.c), dv = r_.alloc(kvn, x.c);
  { std::vector<Buf> scratch = attention_scratch(true, x.b, x.cp_seq, x.cp_seq, x.cp); }
  exchange_back(qn);
  exchange_back(kvn);
  exchange_back(kvn);
}

}  // namespace moetron::planner
